"""Distributed training (docs/distributed.md): DDP buckets, FSDP2 shards and gathers, FSDP1
flat parameters and ZeRO shards in each rank's trace (``DistributedTracking``, driven by the
instrumentation), and the merged report of every rank of a job (``merge_traces``)."""
from ._merge import expand_inputs, merge_traces
from ._process import process_info
from ._tensors import local_tensor
from ._tracking import DistributedTracking

__all__ = ["DistributedTracking", "expand_inputs", "local_tensor", "merge_traces", "process_info"]
