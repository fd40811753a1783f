"""jobs: deploying, operating and supervising jobs that run on ``chiray.actors.runtime``.

* ``submit`` (validate and deploy), ``placement`` and ``pool`` (where hosts run, warm actors), ``jobtopology``;
* ``handle`` (the one job interface), ``job`` (the driver's ``Job``; ``jobcore`` its lifecycle and controller link,
  ``jobcontrols``, ``jobchanges``, ``jobstatus`` and ``jobrelease`` its op routes, rescale and upgrade history,
  reports and end), ``client`` (``attach``, ``AttachedJob``), ``ophandle`` (control ops from the driver), ``tail``;
* ``supervisor`` (recovery), ``detached`` and ``manager`` (the job manager of a detached job; ``managerrecord``,
  ``managerrescales``, ``managersides`` and ``managerinfo`` its record, rescales, sources' sides and reports),
  ``jobstore`` and ``jobfiles`` (its record and files), ``joblogs``, ``metrics``, ``savepoints``;
* ``rescale``, ``rescaler`` and ``rescalejob`` (a rescale plan's runner), ``autoscaler``;
* ``upgrader`` and ``brancher`` (changing a running job's code and graph);
* ``jobvalues`` (the frozen values of the job interface), ``shareddir`` (the shared-storage probe);
* ``harness`` (every host of a job in one process, without Ray, for deterministic tests).
"""
