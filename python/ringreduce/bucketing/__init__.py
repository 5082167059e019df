"""Gradient bucketing: all-reduce gradients in buckets while backward is still running.

A `GradientBucketer` is framework-agnostic. The caller declares every parameter once with
`register`, in model order, then in each step hands over gradients with `ready` as backward
produces them (from a hook, or layer by layer in hand-written code) and calls `wait` before
the optimizer step. Gradients are copied into a few large flat buffers (buckets); as soon as
a bucket holds all of its gradients its all-reduce is launched asynchronously, so the
communication of the last layers overlaps the backward pass of the earlier ones. After
`wait`, every array given to `ready` holds the gradient averaged over all ranks, identical
on every rank, so replicas that start equal stay equal: N ranks with batch b train like one
process with batch N x b.

Example (numpy, hand-written backward)::

    b = rr.GradientBucketer(comm)
    handles = [b.register(name, w.shape, w.dtype) for name, w in params]
    for step in range(steps):
        for h, grad in backward_last_layer_first():
            b.ready(h, grad)
        b.wait()                      # grads now hold the average over ranks
        sgd_update(params, grads)
"""

from .bucketer import GradientBucketer, Handle

__all__ = ["GradientBucketer", "Handle"]
