// tether's web page: live fragments from the event feed, and actions as plain POSTs.
//
// The server sends re-rendered fragments, each with a stable element id. A fragment
// replaces the element with its id, or is inserted into its container in order. A
// fragment sent twice (a replay after a reconnect) replaces the same element again, so
// nothing is ever doubled; the cursor (the SSE id) resumes the feed after a drop, so
// nothing is missed.
(function () {
  "use strict";

  const body = document.body;
  const liveUrl = body.dataset.live;
  const status = document.getElementById("live-status");
  const notice = document.getElementById("notice");
  let cursor = body.dataset.cursor || "";
  let source = null;
  let held = false;
  let timer = null;
  let retry = 250;

  function setStatus(state, text) {
    if (!status) return;
    status.dataset.state = state;
    status.textContent = text;
  }

  // ------------------------------------------------------------------ fragments

  function insertSorted(container, node) {
    const order = node.dataset.order || "";
    const desc = container.dataset.sort === "desc";
    for (const child of container.children) {
      const other = child.dataset.order;
      if (other === undefined) continue;
      if (desc ? other < order : other > order) {
        container.insertBefore(node, child);
        return;
      }
    }
    container.appendChild(node);
  }

  function keepOpen(old, node) {
    // A fold the person opened stays open when its run is re-rendered.
    for (const details of old.querySelectorAll("details[open]")) {
      const twin = details.id ? node.querySelector("#" + CSS.escape(details.id)) : null;
      if (twin) twin.open = true;
    }
    if (old.tagName === "DETAILS" && old.open) node.open = true;
  }

  function adopt(old, node) {
    // A row re-rendered alone keeps what other fragments put inside it (its child
    // threads): each [data-keep] element's children move over to its twin.
    for (const kept of old.querySelectorAll("[data-keep][id]")) {
      const twin = node.querySelector("#" + CSS.escape(kept.id));
      if (twin) twin.replaceChildren(...kept.children);
    }
  }

  function apply(message) {
    for (const fragment of message.fragments || []) {
      const template = document.createElement("template");
      template.innerHTML = fragment.html.trim();
      const node = template.content.firstElementChild;
      if (!node) continue;
      const old = document.getElementById(fragment.id);
      if (fragment.v !== undefined) {
        // Never let an older state replace a newer one (an action's answer arriving after
        // the live feed already showed what came next).
        if (old && old.dataset.v !== undefined && Number(old.dataset.v) > fragment.v) continue;
        node.dataset.v = String(fragment.v);
      }
      const container = fragment.container ? document.getElementById(fragment.container) : null;
      const inPlace = old && (!fragment.container ||
        (old.parentElement === container && old.dataset.order === node.dataset.order));
      if (inPlace) {
        keepOpen(old, node);
        adopt(old, node);
        old.replaceWith(node);
      } else if (container) {
        // New, or moved: to another container, or to another place in its own (a
        // monitor's group follows its latest line).
        if (old) {
          keepOpen(old, node);
          adopt(old, node);
          old.remove();
        }
        insertSorted(container, node);
      } else if (old && !container) {
        old.replaceWith(node);
      }
    }
    counts();
    tick();
    filter();
  }

  // ------------------------------------------------------------------ search

  const search = document.querySelector("input[data-filter]");

  function filter() {
    // Rows whose text (title, id, environment, state) has the query, with the rows they
    // sit in; every group and child list opens while a query is typed.
    if (!search) return;
    const query = search.value.trim().toLowerCase();
    const rows = document.querySelectorAll(search.dataset.filter);
    for (const row of rows) row.hidden = false;
    if (!query) return;
    for (const row of rows) {
      const own = row.querySelector(":scope > .line");
      row.hidden = !(own && own.textContent.toLowerCase().includes(query));
    }
    for (const row of rows) {
      if (row.hidden) continue;
      for (let up = row.parentElement; up; up = up.parentElement) {
        if (up.matches && up.matches(search.dataset.filter)) up.hidden = false;
        if (up.tagName === "DETAILS") up.open = true;
      }
    }
  }

  if (search) search.addEventListener("input", filter);

  function counts() {
    for (const count of document.querySelectorAll("[data-count-for]")) {
      const list = document.getElementById(count.dataset.countFor);
      if (list) count.textContent = String(list.children.length);
    }
  }

  function anchorOf(form) {
    // What a notice follows: the row or card holding the form (found again by its id once
    // the answer re-rendered it), or the form itself.
    const holder = form.closest("li[id], tr[id]");
    return holder ? holder.id : form;
  }

  function slotFor(anchor) {
    // A notice sits right after what caused it, where the person is looking (a fold
    // holding it opens). One notice at a time.
    if (typeof anchor === "string") anchor = document.getElementById(anchor);
    if (!anchor || !anchor.isConnected) return null;
    for (let up = anchor.parentElement; up; up = up.parentElement) {
      if (up.tagName === "DETAILS") up.open = true;
    }
    const next = anchor.nextElementSibling;
    if (next && next.classList.contains("notice-slot")) return next;
    for (const old of document.querySelectorAll(".notice-slot")) old.remove();
    const tag = anchor.tagName === "LI" ? "li" : anchor.tagName === "TR" ? "tr" : "div";
    const slot = document.createElement(tag);
    slot.className = "notice-slot";
    slot.setAttribute("role", "status");
    anchor.after(slot);
    if (tag !== "tr") return slot;
    const cell = document.createElement("td");
    cell.colSpan = 9;
    slot.appendChild(cell);
    return slot;
  }

  function showNotice(anchor, html, error) {
    if (notice) notice.innerHTML = "";
    const slot = slotFor(anchor) || notice;
    if (!slot) return;
    const into = slot.tagName === "TR" ? slot.firstElementChild : slot;
    into.innerHTML = html;
    if (error !== undefined) {
      into.innerHTML = '<div class="notice error"><p></p></div>';
      into.querySelector("p").textContent = error;
    }
    slot.scrollIntoView({ block: "nearest" });
  }

  // ------------------------------------------------------------------ elapsed time

  function secondsText(total) {
    total = Math.max(0, Math.floor(total));
    if (total < 60) return total + " s";
    if (total < 3600) return Math.floor(total / 60) + " min " + (total % 60) + " s";
    return Math.floor(total / 3600) + " h " + Math.floor((total % 3600) / 60) + " min";
  }

  function tick() {
    const now = Date.now();
    for (const time of document.querySelectorAll("time[data-since]")) {
      const since = Date.parse(time.dataset.since);
      if (!isNaN(since)) time.textContent = secondsText((now - since) / 1000);
    }
    // Countdowns (a schedule, a deadline): "4 min 3 s", then "now" once due.
    for (const time of document.querySelectorAll("time[data-until]")) {
      const until = Date.parse(time.dataset.until);
      if (isNaN(until)) continue;
      time.textContent = until > now ? secondsText((until - now) / 1000) : "now (due)";
    }
  }

  // ------------------------------------------------------------------ the live feed

  function connect() {
    clearTimeout(timer);
    timer = null;
    if (!liveUrl || held) return;
    if (source) source.close();
    const url = liveUrl + (liveUrl.includes("?") ? "&" : "?") + "after=" + encodeURIComponent(cursor);
    source = new EventSource(url);
    source.onopen = function () {
      retry = 250;
      setStatus("live", "live");
    };
    source.addEventListener("fragments", function (event) {
      apply(JSON.parse(event.data));
      if (event.lastEventId) {
        cursor = event.lastEventId;
        body.dataset.cursor = cursor;
      }
      setStatus("live", "live");
    });
    source.addEventListener("reload", function () {
      window.location.reload();
    });
    source.onerror = function () {
      drop(false);
    };
  }

  function drop(hold) {
    // The connection is gone (or a test dropped it): close it ourselves, so the browser does
    // not reconnect with a stale URL, and come back from our cursor.
    if (source) source.close();
    source = null;
    held = Boolean(hold);
    setStatus("reconnecting", held ? "disconnected" : "reconnecting…");
    if (held) return;
    clearTimeout(timer);
    timer = setTimeout(function () {
      fetch("/ui/ping", { credentials: "same-origin" })
        .then(function (response) {
          if (response.status === 401) {
            window.location.href = "/signin?next=" + encodeURIComponent(window.location.pathname);
            return;
          }
          connect();
        })
        .catch(function () {
          drop(false);
        });
    }, retry);
    retry = Math.min(2000, retry * 2);
  }

  // ------------------------------------------------------------------ actions

  document.addEventListener("submit", function (event) {
    const form = event.target;
    if (!form.matches || !form.matches("form[data-fragment]")) return;
    event.preventDefault();
    const data = new URLSearchParams(new FormData(form, event.submitter));
    const anchor = anchorOf(form);
    const buttons = form.querySelectorAll("button");
    buttons.forEach(function (b) { b.disabled = true; });
    fetch(form.action, {
      method: "POST",
      body: data,
      credentials: "same-origin",
      headers: { "X-Tether-Fragment": "1", Accept: "application/json" },
    })
      .then(function (response) {
        if (response.status === 401) {
          window.location.href = "/signin?next=" + encodeURIComponent(window.location.pathname);
          return null;
        }
        return response.json().then(function (answer) {
          if (answer.error) {
            showNotice(anchor, "", answer.error.message);
            return;
          }
          apply(answer);
          form.reset(); // a label or message is not sent twice by mistake
          if (answer.notice) showNotice(anchor, answer.notice);
        });
      })
      .catch(function (error) {
        showNotice(anchor, "", "The request failed: " + error);
      })
      .finally(function () {
        buttons.forEach(function (b) { b.disabled = false; });
      });
  });

  window.tetherLive = {
    drop: function () { drop(true); },
    // Reconnect; with ``from``, resume from that cursor (a replay: nothing may double).
    restore: function (from) {
      if (from !== undefined) cursor = String(from);
      held = false;
      retry = 250;
      connect();
    },
    get cursor() { return cursor; },
    get state() { return status ? status.dataset.state : "none"; },
  };

  counts();
  tick();
  setInterval(tick, 1000);
  connect();
})();
