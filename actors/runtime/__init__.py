"""runtime: what runs a job's operators on Ray, one host actor at a time.

The data plane, in the order a record meets it:

* ``host`` (the ``OperatorHost`` actor) and ``mailbox`` (its loop as a plain class, ``HostCore``);
* ``scheduler`` (which instance runs next), ``build`` (an instance from the physical plan);
* ``instance`` and ``source`` (one operator instance), made of ``inputs`` (its input channels in turn and its
  event-time clock), ``outputs`` (routers, output channels, the last watermark), ``controlport`` (its control
  processor and what control input it waits on) and the counters in ``statistics``; ``failure`` says that user
  code raised; ``lifecycle`` holds the small state machines of an instance, a source and a host;
* ``instanceview`` and ``context`` (what control sees of an instance);
* ``channel`` and ``channeltable`` (bounded FIFO channels and their credits), ``router`` (an output edge),
  ``messages`` (what travels on them), ``held`` (records held back while their bins migrate);
* ``outbox`` and ``transport`` (what a step sends, and the one place that sends it), ``relay`` (control trees);
* ``stepresult`` (a step's sends, added up into one frozen value), ``watermarks``;
* ``controller`` (the job's controller actor, a shell) over ``injector`` (the global order of injected control
  ops), ``checkpoints`` (checkpoint numbers, fenced commits) and ``stepwatch`` (long steps of user code);
  ``controlops`` (op bookkeeping), ``hosted`` (a controller that runs inside a host);
* ``topology`` and ``change`` (what a rescale changes on a host and on one instance);
* ``storage``, ``restore`` and ``replicas`` (checkpoint files, restore points, replicated bins).

Nothing here imports ``chiray.actors.jobs``: jobs deploy and operate the runtime, never the other way round.
"""
