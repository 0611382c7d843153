"""The web page's routes, one module per part of the page; :mod:`tether.web.routes` joins them."""
