"""The checker: anyone's implementation against the reference, ``python -m variants.check SPEC``
(docs/check.md). Nothing here is imported by ``import variants`` or by building a registered
variant: the registry loads ``outside`` (and what it uses) only when an outside class is asked for.

    __main__     the command: parses SPEC and options, runs the battery, prints the table, the
                 divergence finder's report and the hints (``main``)
    battery      the checks: ``run_battery`` -> ``Result`` rows (forward, gradients, Adam steps,
                 dropout sites, a fully masked row, bad inputs)
    harness      what every check stands on: ``CONFIG``, ``Case``, ``Result``, ``pair`` (both
                 models holding one seed's weights), ``compared``, ``absent_line``
    diagnose     why a check failed: ``locate`` (a failed forward rerun point by point),
                 ``explain_first``, ``rounding_only``, ``output_hint``, ``explained`` (an error
                 raised inside the model, where and its likely cause), ``still_drops``
    tolerances   the equivalence tolerances, one home for the checker and the tests: ``Tolerance``,
                 ``FLOAT64``, ``FLOAT32``, ``LOSSES``
    divergence   the divergence finder over ``common.probes``' points: ``compare_points``,
                 ``PointDifference``, ``first_divergence``, ``precision_notes``, ``Float32Watch``,
                 ``ROUNDING_FACTOR``
    explain      why the first divergence: the departures recomputed there, the closest that
                 fits named with its evidence (``explain``, ``Explanation``)
    departures   the single classic departures, each sublayer recomputed under each (``RECOMPUTE``)
    combined     beyond them: a wrong map (another module's weights in a slot) and two departures
                 together (``wrong_maps``, ``pairs``)
    outside      an outside class: ``import_class``, ``requirements``, ``build_outside``,
                 ``inferred`` maps, ``protocol``, ``check_signatures``
    adapter      an outside class behind the shared interface: ``interfaced`` (absent weights,
                 per-head targets, ``stack_names``), ``drafting``, ``absent_weights``, ``own_stage``
    suggest      a class's weight and probe maps drafted from its modules and one traced forward
                 pass: ``draft`` (``--suggest-maps``)
    verify       a draft run against the reference before it is printed: verified, corrected by an
                 exchange of same-shaped parameters, or unverified (``verified``, ``run_draft``)
    reading      what the draft reads in a module tree: linears, norms, layer lists, attentions
    patterns     the draft as patterns and as Python to paste: ``Draft``, ``weight_patterns``,
                 ``probe_patterns``, ``complete``, ``as_python``
    sites        where a model applies dropout in train mode, against a named reference's sites
                 (``REFERENCES``: torch.nn.Transformer's, the paper's): ``observed_sites``,
                 ``compare_sites``

Import each from its module (``from variants.check.battery import run_battery``); this index
imports nothing, so ``python -m variants.check`` loads only what the command uses.
"""
