"""Compute models: how long a kernel takes on a device (kernel catalog, roofline or calibrated)."""

from moesim.compute.base import ComputeModel, Kernel
from moesim.compute.devices import DEVICES, DeviceSpec, get_device
from moesim.compute.roofline import RooflineModel, compute_model_from_dict

__all__ = [
    "DEVICES", "ComputeModel", "DeviceSpec", "Kernel", "RooflineModel",
    "compute_model_from_dict", "get_device",
]
