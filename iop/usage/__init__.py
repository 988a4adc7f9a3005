"""
Usage and what it costs, on an Edge: :mod:`.price` (a model's price applied to the usage a
provider reported: exact integer micro-units), :mod:`.ledger` (the SQLite file of one record
per finished request, written off the reactor thread) and :mod:`.query` (the totals
``GET /usage`` and ``iop usage`` answer, and merging several Edges' answers). No module here
imports either side; the Edge builds the ledger (:func:`iop.usage.service.build`).
"""
