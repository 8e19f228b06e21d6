"""The machine model: devices, the links between them and their measured figures (`pesto-cluster/1`).
The public names are re-exported here."""

from pesto_ir.cluster.devices import KINDS, Device, DeviceKind, Link
from pesto_ir.cluster.figures import ClusterError
from pesto_ir.cluster.model import Cluster

__all__ = ["KINDS", "Cluster", "ClusterError", "Device", "DeviceKind", "Link"]
