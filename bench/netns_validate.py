#!/usr/bin/env python3
"""Checks ``ringreduce model`` against all_reduce busbw measured on emulated hosts.

For every layout (H hosts x L ranks), link rate and algorithm asked for, brings up H
network namespaces whose links are shaped to the rate (``bench/netns_hosts.sh``; root
only), runs ``python -m ringreduce bench`` there with RINGREDUCE_ALGORITHM forced to
``ring`` or ``hierarchical`` (ranks numbered host by host: rank r on host r // L), and
sets the measured busbw per size beside the cost model's prediction for the same job,
links and algorithm (``ringreduce.model``). The model is meant to be within 15% at
16 MiB and above.

    python bench/netns_validate.py --layouts 4x1,2x2 --rates 1gbit,2.5gbit,10gbit \\
        --sizes 1M..256M --iters 5 --warmup 2 --calibrate --out netns_validate
    python bench/netns_validate.py --from-json netns_validate/validate.json
    python bench/netns_validate.py --dry-run ...      # the plan and its expected duration

Writes, under --out: ``validate.json`` (one row per layout, rate, algorithm and size:
measured and model busbw, and their ratio measured / model), ``validate.txt`` (a table
per configuration and a summary line each), ``validate.png`` (busbw against size, one
panel per layout: measured dots, model lines, line rates dotted), and ``bench/`` (every
rank's output and rank 0's ``ringreduce bench --json``). ``--from-json`` only renders
the txt and png again from a validate.json, and needs neither root nor ringreduce.

Both sides use the bench's busbw, ``algbw x 2(N-1)/N`` with GB = 1e9 bytes, for the
hierarchical all_reduce too, so measured / model is the model's time over the measured
time. The network link of the model is the tbf rate times the share of each frame
that is TCP payload (``--wire-efficiency``, 1448/1514 at MTU 1500); its latency
(``--alpha-us``), the shared memory between the ranks of a host (``--shm-gbs``,
``--shm-alpha-us``) and the reduction throughput (``--reduce-gbs``) are given, else
fitted by the model's probe on local ranks (``--calibrate``, as ``ringreduce model
--probe``), else the model's defaults; validate.txt says which numbers the model used
and where each came from. ``--from-json ... --remodel --fit-below 16M`` instead
calibrates each configuration's network link on its own sizes below 16 MiB, as a short
probe of the job would, and predicts the sizes from 16 MiB up with it.

The code is the package ``bench/netns/`` beside this script.
"""

import sys

from netns.cli import main

if __name__ == "__main__":
    sys.exit(main(doc=__doc__))
