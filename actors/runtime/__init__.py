"""runtime: what runs a job's operators on Ray, one host actor at a time.

The data plane, in the order a record meets it:

* ``host`` (the ``OperatorHost`` actor) and ``mailbox`` (its loop as a plain class, ``HostCore``);
* ``scheduler`` (which instance runs next), ``build`` (an instance from the physical plan);
* ``instance`` and ``source`` (one operator instance), made of ``inputs``, ``outputs``, ``controlport`` and the
  counters in ``statistics``; ``lifecycle`` (its, a source's and a host's states), ``failure`` (user code raised);
  ``instanceview`` and ``context`` (what control sees of it), ``change`` (what a rescale changes of it);
* ``channel`` and ``channeltable`` (bounded FIFO channels and their credits), ``router`` (an output edge),
  ``messages`` (what travels on them), ``held`` (records held back while their bins migrate);
* ``outbox`` and ``transport`` (what a step sends, and the one place that sends it), ``relay`` (control trees);
* ``stepresult``, ``statistics`` and ``watermarks`` (values an instance hands back);
* ``controller`` and ``controlops`` (the job's controller actor), ``topology`` (rescale's changes to a host);
* ``storage``, ``restore`` and ``replicas`` (checkpoint files, restore points, replicated bins).

Nothing here imports ``chiray.actors.jobs``: jobs deploy and operate the runtime, never the other way round.
"""
