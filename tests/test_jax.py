"""JAX: 16-bit leaves that numpy's DLPack import refuses, pytrees of registered
dataclasses in all_reduce_tree (handed back as JAX arrays), and examples/jax_dp.py.

The values are small integers, exact in bfloat16, so the sums compare with 0 ULP.
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys

import numpy as np
import pytest

jax = pytest.importorskip("jax", reason="needs jax: pip install jax (the CPU wheel), then rerun")
jnp = jax.numpy

import ringreduce as rr  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class Dense:
    w: jax.Array
    b: jax.Array


def launch(code: str, n: int = 2) -> dict:
    """Runs ``code`` as n ranks under ringreduce launch; {rank: its last output line}."""
    cmd = [
        sys.executable,
        "-m",
        "ringreduce",
        "launch",
        "-n",
        str(n),
        "--",
        sys.executable,
        "-c",
        code,
    ]
    env = {k: v for k, v in os.environ.items() if k != "RINGREDUCE_TRANSPORT"}
    r = subprocess.run(
        cmd,
        capture_output=True,
        text=True,
        timeout=180,
        cwd=ROOT,
        env=env,
        stdin=subprocess.DEVNULL,
    )
    assert r.returncode == 0, (r.stdout + r.stderr)[-4000:]
    last: dict = {}
    for line in r.stdout.splitlines():
        rank, _, text = line.partition("] ")
        last[int(rank.lstrip("["))] = text
    return last


def test_bfloat16_leaf_numpy_cannot_import_is_still_reduced():
    x = jnp.arange(6, dtype=jnp.bfloat16)
    with pytest.raises(Exception, match="(?i)dtype"):
        np.from_dlpack(x)  # the refusal the fallback is for
    with rr.init(rank=0, world_size=1, master_port=_port()) as comm:
        for dtype in (jnp.bfloat16, jnp.float16):
            out = comm.all_reduce(jnp.arange(6, dtype=dtype) * 2, op="sum")
            assert out.dtype.name == jnp.dtype(dtype).name
            assert np.asarray(out, dtype=np.float32).tolist() == [0, 2, 4, 6, 8, 10]


def test_16_bit_leaves_across_ranks():
    code = (
        "import jax.numpy as jnp, numpy as np, ringreduce as rr\n"
        "comm = rr.init(timeout=60)\n"
        "sums = []\n"
        "for dt in (jnp.bfloat16, jnp.float16):\n"
        "    x = (comm.rank + 1) * jnp.arange(8, dtype=dt)\n"
        "    sums.append(np.asarray(comm.all_reduce(x), np.float32).tolist())\n"
        "print(sums)\n"
        "comm.close()\n"
    )
    expected = [float(3 * i) for i in range(8)]  # (1 + 2) * i
    assert launch(code) == {0: str([expected, expected]), 1: str([expected, expected])}


def tree() -> dict:
    return {
        "layers": [Dense(jnp.full((2, 3), 2.0, jnp.bfloat16), jnp.arange(3.0, dtype=jnp.float32))],
        "scale": jnp.ones(2, jnp.float16),
        "host": np.full(4, 6.0),  # a numpy leaf stays numpy, reduced in place
    }


def test_all_reduce_tree_keeps_a_pytree_of_dataclasses():
    with rr.init(rank=0, world_size=1, master_port=_port()) as comm:
        bucketer = rr.GradientBucketer(comm, average=True)
        given = tree()
        out = bucketer.all_reduce_tree(given)
        assert jax.tree_util.tree_structure(out) == jax.tree_util.tree_structure(given)
        layer = out["layers"][0]
        assert isinstance(layer, Dense)
        for got, was in (
            (layer.w, given["layers"][0].w),
            (layer.b, given["layers"][0].b),
            (out["scale"], given["scale"]),
        ):
            assert isinstance(got, jax.Array) and got.dtype == was.dtype
            assert np.array_equal(np.asarray(got, np.float32), np.asarray(was, np.float32))
        assert out["host"] is given["host"]
        names = [name for bucket in bucketer.plan for name in bucket]
        assert "['layers'][0].w" in names, names
        again = bucketer.all_reduce_tree(tree())  # registrations reused: same leaves
        assert isinstance(again["layers"][0].w, jax.Array)


def test_all_reduce_tree_averages_across_ranks():
    code = (
        "import dataclasses, jax, jax.numpy as jnp, numpy as np, ringreduce as rr\n"
        "@jax.tree_util.register_dataclass\n"
        "@dataclasses.dataclass\n"
        "class Dense:\n"
        "    w: jax.Array\n"
        "    b: jax.Array\n"
        "comm = rr.init(timeout=60)\n"
        "k = comm.rank + 1.0\n"
        "g = [Dense(jnp.full((3, 2), 2 * k, jnp.bfloat16), jnp.full(2, 4 * k))]\n"
        "out = rr.GradientBucketer(comm).all_reduce_tree(g)\n"
        "leaves = jax.tree_util.tree_leaves(out)\n"
        "print(type(out[0]).__name__, [isinstance(x, jax.Array) for x in leaves],\n"
        "      [str(x.dtype) for x in leaves], [np.asarray(x, np.float32).ravel().tolist()\n"
        "      for x in leaves])\n"
        "comm.close()\n"
    )
    # Averages of k = 1, 2: w = 2 * 1.5 = 3, b = 4 * 1.5 = 6.
    line = "Dense [True, True] ['bfloat16', 'float32'] [[3.0, 3.0, 3.0, 3.0, 3.0, 3.0], [6.0, 6.0]]"
    assert launch(code) == {0: line, 1: line}


# A whole training run: in the extended run (CI runs it).
@pytest.mark.extended
def test_jax_dp_example_replicas_identical():
    cmd = [
        sys.executable,
        "-m",
        "ringreduce",
        "launch",
        "-n",
        "2",
        "--",
        sys.executable,
        os.path.join(ROOT, "examples", "jax_dp.py"),
        "--grads",
        "bfloat16",
    ]
    env = {k: v for k, v in os.environ.items() if k != "RINGREDUCE_TRANSPORT"}
    r = subprocess.run(
        cmd, capture_output=True, text=True, timeout=240, env=env, stdin=subprocess.DEVNULL
    )
    assert r.returncode == 0, (r.stdout + r.stderr)[-4000:]
    assert "2 ranks" in r.stdout and "replicas identical: True" in r.stdout, r.stdout[-2000:]
    accuracy = float(r.stdout.split("test accuracy ")[1].split(",")[0])
    assert accuracy > 0.9, r.stdout[-2000:]


def _port() -> int:
    from ringreduce.launch import free_port

    return free_port()
