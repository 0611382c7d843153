"""The pure domain: records and the rules that move them between states.

Nothing here does I/O. The engine loads records from the store, asks these modules what
happens next, and writes the answer back in one transaction.
"""
