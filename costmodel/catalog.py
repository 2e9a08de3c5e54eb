"""Built-in catalogs of devices and links, with the vendors' published peak numbers.

Peaks are *dense* numbers from the vendors' datasheets (no 2:4 sparsity), in the units of
the datasheet: TFLOPS (10^12 flop/s), GB (10^9 bytes) and GB/s (10^9 bytes/s). The cost
model turns them into base units (flops per second, bytes, bytes per second) once, in
:mod:`costmodel.cluster`; nothing else reads this table.

Where a device has no hardware path for a dtype (bf16 before Ampere, TF32 before Ampere),
the entry repeats the fp32 peak: that is what the framework falls back to, so a plan priced
in that dtype is not made to look faster than the card can run it. Such a dtype is listed in
the entry's ``unrated`` (no rate of its own): ``--precision fp16`` refuses a device whose fp16
is unrated, and ``--precision auto`` picks only a dtype every device rates above its fp32.

Link numbers are per direction (what one rank can push to its neighbour in a ring), which
is what the alpha-beta model in :mod:`costmodel.collectives` needs. Latencies are typical
end-to-end small-message times of a collective step over that link; they are
order-of-magnitude defaults that ``hapc profile`` replaces with measurements.
"""

from __future__ import annotations

from dataclasses import dataclass

DTYPES = ("fp32", "tf32", "bf16", "fp16")


@dataclass(frozen=True)
class DeviceSpec:
    """One device model as published: peak TFLOPS per dtype, memory GB and HBM GB/s."""

    name: str
    tflops: dict[str, float]
    memory_GB: float
    hbm_GBps: float
    note: str = ""
    unrated: frozenset[str] = frozenset()     # dtypes not in ``tflops`` as given (filled with fp32)

    def __post_init__(self) -> None:
        given = dict(self.tflops)
        object.__setattr__(self, "unrated", self.unrated | {k for k in DTYPES if k not in given})
        object.__setattr__(self, "tflops", {k: given.get(k, given["fp32"]) for k in DTYPES})


@dataclass(frozen=True)
class LinkSpec:
    """One link technology: bandwidth per direction and per-message latency."""

    name: str
    bandwidth_GBps: float
    latency_us: float
    note: str = ""


def _peaks(fp32: float, tf32: float | None = None, bf16: float | None = None,
           fp16: float | None = None) -> dict[str, float]:
    """The rates given; :class:`DeviceSpec` fills the others with fp32 (the dtype then runs on
    the fp32 units) and lists them as unrated."""
    given = {"tf32": tf32, "bf16": bf16, "fp16": fp16}
    return {"fp32": fp32, **{k: v for k, v in given.items() if v is not None}}


_DEVICES = [
    DeviceSpec("V100-16GB", _peaks(15.7, fp16=125.0), 16, 900, "SXM2; no bf16/tf32 units"),
    DeviceSpec("V100-32GB", _peaks(15.7, fp16=125.0), 32, 900, "SXM2; no bf16/tf32 units"),
    DeviceSpec("P100-16GB", _peaks(9.3, fp16=18.7), 16, 732,
               "PCIe card, as in cloud P100 servers (SXM2: 10.6 fp32); fp16 at 2x fp32, no tensor cores"),
    DeviceSpec("T4", _peaks(8.1, fp16=65.0), 16, 320, "no bf16/tf32 units"),
    DeviceSpec("A10", _peaks(31.2, tf32=62.5, bf16=125.0, fp16=125.0), 24, 600),
    DeviceSpec("L4", _peaks(30.3, tf32=60.0, bf16=121.0, fp16=121.0), 24, 300),
    DeviceSpec("A100-40GB", _peaks(19.5, tf32=156.0, bf16=312.0, fp16=312.0), 40, 1555, "SXM4"),
    DeviceSpec("A100-80GB", _peaks(19.5, tf32=156.0, bf16=312.0, fp16=312.0), 80, 2039, "SXM4"),
    DeviceSpec("H100", _peaks(66.9, tf32=494.7, bf16=989.4, fp16=989.4), 80, 3350, "SXM5"),
    DeviceSpec("RTX3090", _peaks(35.6, tf32=35.6, bf16=71.0, fp16=71.0), 24, 936,
               "tensor-core fp16/bf16 with fp32 accumulate, as training uses"),
    DeviceSpec("RTX4090", _peaks(82.6, tf32=82.6, bf16=165.2, fp16=165.2), 24, 1008,
               "tensor-core fp16/bf16 with fp32 accumulate, as training uses"),
    DeviceSpec("MI250", _peaks(45.3, bf16=362.1, fp16=362.1), 128, 3277,
               "both dies of the OAM module as one device; fp32 vector peak"),
    DeviceSpec("cpu", _peaks(0.1, bf16=0.1, fp16=0.1), 16, 20,
               "a modest default for a few CPU cores; profile for real numbers. CPU autocast runs bf16 and "
               "fp16, at about the fp32 rate (so --precision auto keeps fp32)"),
]

# Short names people use for the common variant.
_DEVICE_ALIASES = {
    "V100": "V100-32GB", "V100-SXM2": "V100-32GB", "P100": "P100-16GB", "A100": "A100-40GB",
    "A100-SXM4-40GB": "A100-40GB", "A100-SXM4-80GB": "A100-80GB", "H100-SXM": "H100",
    "H100-SXM5": "H100", "H100-80GB": "H100", "RTX-3090": "RTX3090", "RTX-4090": "RTX4090",
    "GeForce-RTX-3090": "RTX3090", "GeForce-RTX-4090": "RTX4090", "MI250X": "MI250",
}

# Short names whose device also comes with another memory size: planning for the wrong one gives
# plans that do not fit, or leave memory unused, so the choice is said out loud.
_OTHER_MEMORY = {"V100": "V100-16GB", "A100": "A100-80GB"}

_LINKS = [
    LinkSpec("nvlink1", 80, 3, "P100: 4 links x 20 GB/s"),
    LinkSpec("nvlink2", 150, 3, "V100: 6 links x 25 GB/s"),
    LinkSpec("nvlink3", 300, 3, "A100: 12 links x 25 GB/s"),
    LinkSpec("nvlink4", 450, 3, "H100: 18 links x 25 GB/s"),
    LinkSpec("pcie3", 15.75, 5, "x16"),
    LinkSpec("pcie4", 31.5, 5, "x16"),
    LinkSpec("pcie5", 63, 5, "x16"),
    LinkSpec("ethernet10g", 1.25, 50, "TCP"),
    LinkSpec("ethernet25g", 3.125, 30, "TCP"),
    LinkSpec("ethernet100g", 12.5, 20, "TCP/RoCE"),
    LinkSpec("infiniband-hdr", 25, 5, "200 Gb/s"),
    LinkSpec("infiniband-ndr", 50, 4, "400 Gb/s"),
    LinkSpec("loopback", 10, 10, "processes on one host through shared memory (gloo on CPU)"),
]

_LINK_ALIASES = {
    "nvlink": "nvlink2", "pcie": "pcie3", "10gbe": "ethernet10g", "25gbe": "ethernet25g",
    "100gbe": "ethernet100g", "eth10g": "ethernet10g", "eth25g": "ethernet25g",
    "eth100g": "ethernet100g", "hdr": "infiniband-hdr", "ndr": "infiniband-ndr",
    "ib-hdr": "infiniband-hdr", "ib-ndr": "infiniband-ndr", "shm": "loopback",
}


def normalize(name: str) -> str:
    """Lookup key: case-insensitive, blind to ``-``, ``_`` and spaces (``"a100_80gb"`` = ``"A100-80GB"``)."""
    return "".join(ch for ch in str(name).lower() if ch not in "-_ ")


def _index(items, aliases) -> dict:
    table = {normalize(x.name): x for x in items}
    for alias, target in aliases.items():
        table.setdefault(normalize(alias), table[normalize(target)])
    return table


_DEVICE_INDEX = _index(_DEVICES, _DEVICE_ALIASES)
_LINK_INDEX = _index(_LINKS, _LINK_ALIASES)


def device_spec(name: str) -> DeviceSpec | None:
    """The catalog entry for a device type name, or None when unknown."""
    return _DEVICE_INDEX.get(normalize(name))


def alias_note(name: str) -> str | None:
    """What a short device name was read as, when the device also comes with another memory
    size (``A100`` -> A100-40GB; the 80 GB one is ``A100-80GB``); None otherwise."""
    for alias, other in _OTHER_MEMORY.items():
        if normalize(name) == normalize(alias):
            read, alt = device_spec(alias), device_spec(other)
            return (f"type {name} is read as {read.name} ({read.memory_GB:g} GB); say {alt.name} if yours "
                    f"has {alt.memory_GB:g} GB")
    return None


def link_spec(name: str) -> LinkSpec | None:
    """The catalog entry for a link name, or None when unknown."""
    return _LINK_INDEX.get(normalize(name))


def device_names() -> list[str]:
    return [d.name for d in _DEVICES]


def link_names() -> list[str]:
    return [lk.name for lk in _LINKS]
