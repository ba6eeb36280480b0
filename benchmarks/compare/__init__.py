"""compare.py's engine: everything ``python compare.py`` runs, and the only package it imports.

One job per module, in the order a run uses them:

    workload       the timing presets, shapes and dtypes, the FLOP count every row shares
    steps          the timed steps (forward, forward + backward, decoding), autocast, compiling
    dropout_masks  the compile backend: inductor with dropout's masks drawn by aten
    machine        whether the cores are busy, the threads to time with, the OpenMP wait policy
    settings       ``Settings``: everything one run is asked to do, frozen; compare.py's options, -> it
    measured       what a run measures: a ``Cell`` per (variant, mode), a ``Row`` per variant
    ratios         ratios paired by round with their bootstrap interval; the rounds' shuffled orders;
                   which ratios the table prints and how far each is resolved
    timing         ``torch.utils.benchmark`` timers for the steps and the matmul peak
    memory         the allocator policy, each step's peak memory, the key/value cache's bytes
    placement      each row's weights re-placed in fresh memory before every round
    failures       telling an out-of-memory apart, and recovering from a failed step
    report         measured rows -> the report (a dict, also the JSON output)
    render         the report as tables (tabulate), JSON or CSV
    plot           the report as a picture of relative times (compare.py --plot)
    run            ``run(settings) -> report``: the phases of a run, by name
    processes      the run repeated in fresh interpreters, their rounds pooled (a CPU run's default)

Method:
- one analytic FLOP count for every row (``workload.forward_flops``; a train step counts 3x);
- many short rounds (``Settings.rounds``; with ``Settings.resolution``, more until every ratio
  is resolved to it), on the CPU by default spread over four fresh processes
  (``Settings.processes``, ``processes``), each timing every row once in a fresh shuffled order
  (``ratios.round_orders``) after re-placing every row's weights in fresh memory
  (``placement``), the cores' load read in every round; a cell's time is its rounds merged,
  and each ratio between rows is paired by round, its median over rounds (a geometric mean of
  each process's median), with a 95% bootstrap interval (``ratios.paired_ratio``) and a
  control: torch timed again as a row of its own;
- the thread count is fixed (``Settings.threads``) and reported; CUDA is synchronised by the
  Timer; the entry points choose it from the cores other processes leave free
  (``machine.settle_threads``);
- peak memory: CUDA ``max_memory_allocated`` over the step; CPU the peak of the bytes the
  step allocates (``torch.profiler`` memory events, in time order); both plus the model's own
  parameters and buffers;
- glibc is told to keep freed memory for reuse (``memory.keep_freed_memory``), because
  returning large buffers to the OS makes every step page-fault them back in.
"""
