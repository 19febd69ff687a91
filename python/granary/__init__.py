"""granary from Python: a client of a granary parameter-server cluster (tables, pull, push,
dense parameters, sync jobs, checkpoints, stats), an embedded local cluster, and, in
granary.torch, PyTorch modules whose embedding tables live on granary (docs/python.md).

The C extension (granary._granary) does the work; this module adds argument conveniences:
tensors and lists where arrays are wanted, dicts for JSON specs, and results as numpy arrays.
Errors from granary raise GranaryError with granary's message, .code and .name.
"""
import json as _json

import numpy as _np

from . import _granary
from ._granary import (GranaryError, LocalCluster, CriteoReader, Op, auc, criteo_feature_id,
                       datagen, dedup, dlrm_dense, dlrm_interact, dlrm_interact_backward,
                       dlrm_table_spec, SYNC_ASYNC, SYNC_SYNC,
                       SYNC_SEMISYNC, SYNC_SSP, PUSH_APPLIED, PUSH_STAGED, PUSH_DROPPED,
                       PUSH_DUPLICATE, VERSION, gather_rows, segment_sum)

__all__ = ["Client", "GranaryError", "LocalCluster", "CriteoReader", "Op", "auc",
           "criteo_feature_id", "datagen", "dedup", "dlrm_dense", "dlrm_interact",
           "dlrm_interact_backward", "dlrm_table_spec",
           "gather_rows", "segment_sum",
           "SYNC_MODES", "VERSION"]

# Sync mode names as `granary train --mode` spells them.
SYNC_MODES = {"async": SYNC_ASYNC, "sync": SYNC_SYNC, "semisync": SYNC_SEMISYNC, "ssp": SYNC_SSP}


def as_array(x, dtype):
    """x as a numpy array the extension accepts, without copying tensors or arrays: a torch
    tensor becomes its .numpy() view (it must be a contiguous CPU tensor), a list or tuple a
    new array of dtype. Arrays of the wrong element type are passed on unchanged, so the
    extension refuses them with a TypeError naming the argument."""
    if hasattr(x, "detach") and hasattr(x, "numpy"):
        return x.detach().numpy()
    if isinstance(x, (list, tuple)):
        return _np.asarray(x, dtype=dtype)
    return x


def _spec_text(spec):
    return spec if isinstance(spec, str) else _json.dumps(spec)


class Client(_granary.Client):
    """A connection to every shard of a granary cluster.

    Client(servers="host:port,host:port" or a list of them, auth_file=None, ...),
    Client(cluster_file=PATH), or Client(coord="zk://HOSTS/PATH"): the shards of a coordinated
    job, found through its layout (docs/coord.md). Under coord= every request carries the
    layout's epoch; a shard that refuses it as stale makes the client re-read the layout and
    send the request again when that shard still serves at the same address. When a standby
    took a lost shard's index over (a new address), the operation fails with GranaryError
    (GR_ESTALE or GR_ECONN): call refresh() with nothing in flight to follow the layout, then
    go on (the standby serves the shard's rows from the job's checkpoint).
    """

    def __init__(self, servers=None, coord=None, cluster_file=None, auth_file=None,
                 connect_timeout_ms=5000, request_timeout_ms=30000, any_shard=False):
        if isinstance(servers, (list, tuple)):
            servers = ",".join(servers)
        super().__init__(servers=servers, cluster_file=cluster_file, auth_file=auth_file,
                         connect_timeout_ms=connect_timeout_ms,
                         request_timeout_ms=request_timeout_ms, any_shard=any_shard,
                         coord=coord)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # Tables ----------------------------------------------------------------------------------
    def create_table(self, spec):
        """Creates a table on every shard from its spec (dict or JSON text, docs/table.md)."""
        super().create_table(_spec_text(spec))

    def describe_table(self, name):
        """{"spec": {...}, "rows": R, "bytes": B, "shards": [...]}"""
        return _json.loads(super().describe_table(name))

    def stats(self, shard=0):
        return _json.loads(super().stats(shard))

    def dense_create(self, spec):
        super().dense_create(_spec_text(spec))

    # Rows --------------------------------------------------------------------------------------
    def pull(self, table, dim, keys, out=None, readonly=False, unique=False):
        """Rows of keys, as a (len(keys), dim) float32 array (out, when given, is filled in
        place and returned)."""
        keys = as_array(keys, _np.uint64)
        if out is None:
            out = _np.empty((len(keys), dim), dtype=_np.float32)
        super().pull(table, dim, keys, as_array(out, _np.float32), readonly=readonly,
                     unique=unique)
        return out

    def pull_start(self, table, dim, keys, out, readonly=False, unique=False):
        return super().pull_start(table, dim, as_array(keys, _np.uint64),
                                  as_array(out, _np.float32), readonly=readonly, unique=unique)

    def push(self, table, dim, keys, grads, unique=False):
        super().push(table, dim, as_array(keys, _np.uint64), as_array(grads, _np.float32),
                     unique=unique)

    def push_start(self, table, dim, keys, grads, unique=False):
        return super().push_start(table, dim, as_array(keys, _np.uint64),
                                  as_array(grads, _np.float32), unique=unique)

    def delete(self, table, dim, keys):
        return super().delete(table, dim, as_array(keys, _np.uint64))

    # Dense parameters ---------------------------------------------------------------------------
    def dense_pull(self, name, out):
        super().dense_pull(name, as_array(out, _np.float32))
        return out

    def dense_push(self, name, grad):
        super().dense_push(name, as_array(grad, _np.float32))

    def dense_set(self, name, values):
        super().dense_set(name, as_array(values, _np.float32))

    # Sync jobs ---------------------------------------------------------------------------------
    def sync_configure(self, mode, workers=1, aggregate=0, staleness=0, reset=False,
                       clear=False):
        if isinstance(mode, str):
            if mode not in SYNC_MODES:
                raise ValueError("mode %r: want one of %s" % (mode, ", ".join(SYNC_MODES)))
            mode = SYNC_MODES[mode]
        return super().sync_configure(mode, workers, aggregate, staleness, reset, clear)
