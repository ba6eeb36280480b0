"""The checker: anyone's implementation against the reference, ``python -m variants.check SPEC``
(docs/check.md). Nothing here is imported by ``import variants`` or by building a registered
variant: the registry loads ``outside`` (and ``suggest``) only when an outside class is asked for.

    __main__     the command: parses SPEC and options, runs the battery, prints the table, the
                 divergence finder's report and the hints (``main``)
    battery      the equivalence battery: ``run_battery`` -> ``Result`` rows, ``locate`` (a failed
                 forward rerun point by point), ``explain_first``, ``still_drops``, ``explained``
                 (an error raised inside the model, where and its likely cause), ``CONFIG``
    tolerances   the equivalence tolerances, one home for the checker and the tests: ``Tolerance``,
                 ``FLOAT64``, ``FLOAT32``, ``LOSSES``
    divergence   the divergence finder over ``common.probes``' points: ``compare_points``,
                 ``PointDifference``, ``first_divergence``, ``precision_notes``, ``Float32Watch``,
                 ``ROUNDING_FACTOR``
    explain      why the first divergence: the classic departures recomputed there, the one that
                 fits named with its evidence (``explain``, ``Explanation``)
    outside      an outside class behind the shared interface: ``import_class``, ``requirements``,
                 ``build_outside``, ``interfaced`` (per-head targets, ``stack_names``), ``drafting``,
                 ``protocol``, ``check_signatures``, ``absent_weights``
    suggest      a class's weight and probe maps drafted from its modules: ``draft``, ``complete``,
                 ``as_python`` (``--suggest-maps``)
    sites        where a model applies dropout in train mode, against a named reference's sites
                 (``REFERENCES``: torch.nn.Transformer's, the paper's): ``observed_sites``,
                 ``compare_sites``

Import each from its module (``from variants.check.battery import run_battery``); this index
imports nothing, so ``python -m variants.check`` loads only what the command uses.
"""
