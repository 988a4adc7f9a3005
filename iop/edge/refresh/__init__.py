# -*- test-case-name: iop.test.edge.refresh -*-
"""
Live config refresh: read edge.yaml again, classify every change against the running config
(live, restart required, rejected), apply an all-live candidate atomically, push what changed to
the ready nodes, and report it all in one result document.

- :mod:`iop.edge.refresh.report`: the result document (``RefreshResult``, ``ChangeReport``,
  ``NodePush``) and its JSON form;
- :mod:`iop.edge.refresh.classify`: the diff of a candidate against the running config, each
  change with its class (the table in the README, "Config refresh");
- :mod:`iop.edge.refresh.apply`: ``LiveApplier``, the running Edge parts switched together;
- :mod:`iop.edge.refresh.service`: ``ConfigRefresher``, the one code path behind
  ``POST /config/refresh``, ``iop config refresh`` and SIGHUP.
"""
