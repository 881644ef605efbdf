"""Kubernetes names rlalloc relies on: the PyTorchJob API, the training operator's pod labels,
and rlalloc's own annotations.

One module so the actuator that reads and writes them and the digital twin that imitates the
training operator agree. Annotations carry what the API objects do not: the worker count the user
asked for (the actuator changes `Worker.replicas`), the job's scaling curve and restore time (for
policies that reason about speed-up), and the placement the policy chose (per-node worker counts,
which node affinity alone cannot express).
"""

import re

PYTORCHJOB_GROUP = "kubeflow.org"
PYTORCHJOB_VERSION = "v1"
PYTORCHJOB_PLURAL = "pytorchjobs"
PYTORCHJOB_KIND = "PyTorchJob"
PYTORCHJOB_CRD = f"{PYTORCHJOB_PLURAL}.{PYTORCHJOB_GROUP}"
"""Name of the PyTorchJob CustomResourceDefinition."""

JOB_NAME_LABEL = "training.kubeflow.org/job-name"
"""Label the training operator puts on every pod of a job."""
REPLICA_TYPE_LABEL = "training.kubeflow.org/replica-type"
"""Replica type of a pod (`worker` for elastic PyTorchJobs)."""
REPLICA_INDEX_LABEL = "training.kubeflow.org/replica-index"
"""Index of the pod among its replica type; scaling down removes the highest indices."""
HOSTNAME_LABEL = "kubernetes.io/hostname"
"""Node label used by the placement's node affinity."""

REQUESTED_WORKERS_ANNOTATION = "rlalloc.io/requested-workers"
"""Workers the user asked for; written on the first change if absent (from Worker.replicas)."""
PLACEMENT_ANNOTATION = "rlalloc.io/placement"
"""Workers per node the policy chose, e.g. ``node-a=2,node-b=1``."""
SPEED_ANNOTATION = "rlalloc.io/speed-1gpu"
"""Iterations per second on one GPU (scaling curve, optional)."""
ALPHA_ANNOTATION = "rlalloc.io/scaling-alpha"
BETA_ANNOTATION = "rlalloc.io/scaling-beta"
"""Scaling-curve coefficients (see env.state.Jobs.scaling_alpha), optional."""
RESTORE_ANNOTATION = "rlalloc.io/restore-seconds"
"""Checkpoint-restore time of the job, optional."""
LAST_CHANGE_ANNOTATION = "rlalloc.io/last-change"
"""Cluster time (Unix seconds) of rlalloc's last change of the job: its cooldown, kept in the
cluster so that a restarted or new leader honours it."""
DISRUPTIONS_ANNOTATION = "rlalloc.io/disruptions"
"""Cluster times of rlalloc's disruptive changes of the job in the last hour, comma-separated:
the hourly disruption cap, kept in the cluster likewise."""
MOVE_FAILURES_ANNOTATION = "rlalloc.io/move-failures"
"""rlalloc's record of the job's failing move (JSON: the move, its consecutive failed tries, the
latest one's time and error, whether it is half applied): its retry backoff and give-up, kept in
the cluster likewise (`actuator.failed_moves`)."""
HELD_ANNOTATION = "rlalloc.io/held"
"""Set when rlalloc gave a move of the job up, ``MoveGivenUp: <move> failed N times (<error>)
since <time>``: the job is left alone until it, its worker pods or its nodes' readiness change,
or someone removes this annotation."""


NAMESPACE_RULE = ("lowercase letters, digits and '-', at most 63, starting and ending with a "
                  "letter or digit")
"""What a namespace name may be (an RFC 1123 label), as errors say it."""


def is_namespace_name(name: str) -> bool:
    """Whether `name` can name a namespace (`NAMESPACE_RULE`). The API server answers any other
    with a 404 that reads like a missing API, not a bad name."""
    return len(name) <= 63 and re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", name) is not None


def format_placement(nodes: tuple[str, ...]) -> str:
    """``node-a=2,node-b=1`` for a worker-per-node tuple such as ('node-a', 'node-a', 'node-b')."""
    counts: dict[str, int] = {}
    for node in nodes:
        counts[node] = counts.get(node, 0) + 1
    return ",".join(f"{node}={count}" for node, count in sorted(counts.items()))


def parse_placement(text: str) -> dict[str, int]:
    """Inverse of `format_placement` (empty or malformed parts are skipped)."""
    counts: dict[str, int] = {}
    for part in text.split(","):
        node, _, count = part.strip().partition("=")
        if node and count.isdigit():
            counts[node] = int(count)
    return counts
