"""Workloads: the jobs a simulation replays, from real traces, the user's CSV or the generator."""

from rlalloc.env.workload.spec import JobSpec, Workload

__all__ = ["JobSpec", "Workload"]
