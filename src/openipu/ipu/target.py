"""IPU generations and systems, as data.

Every architecture number lives in :data:`FACTS` with the source it comes from; the
:class:`Target` dataclass is built from those rows and never invents a number of its own.
Sources are the ones summarised in ``shared/research/ipu_calibration.md`` and
``shared/research/poplar.md`` (section 1.2):

- ``[P]`` primary (a Graphcore datasheet or document), ``[D]`` derived by arithmetic from
  primary figures, ``[T6]`` reproduced exactly by Poplar tutorial 6's cost search,
  ``[A]`` an assumption (not published; stated as such wherever it is used).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

#: One row per (generation, quantity): (value, source).
FACTS: dict[str, dict[str, tuple[object, str]]] = {
    "ipu1": {
        "tiles_per_ipu": (1216, "[P] Mk1 GC2 Target printout (graphcore/tensorflow logging docs); [T6] tut6 'Worst cost seen: 64373'"),
        "bytes_per_tile": (256 * 1024, "[P] 256 KiB per tile, 304 MB per GC2"),
        "clock_hz": (1.6e9, "[P] GC2 1.6 GHz (Target printout)"),
        "amp_macs_half": (32, "[D] 124.5 TFLOPS fp16 / (2 x 1216 tiles x 1.6 GHz)"),
        "amp_macs_half_fp32_partials": (32, "[D] as fp16 (Mk1 has one AMP rate for mixed precision)"),
        "amp_macs_float": (8, "[D] 31.1 TFLOPS fp32 / (2 x 1216 x 1.6 GHz)"),
        "amp_macs_quarter": (0, "[P] no fp8 on Mk1"),
        "ipu_link_bytes_per_s": (3 * 32e9, "[S] 3 IPU-Links per GC2 board (third-party summary)"),
        "host_bytes_per_s": (16e9, "[A] PCIe Gen3 x16 host link"),
        "gw_link_bytes_per_s": (0.0, "[P] no IPU-Gateway on Mk1 systems: racks are not joined by GW-Links"),
    },
    "ipu2": {
        "tiles_per_ipu": (1472, "[P] GC200; [T6] tut6 'Worst cost seen: 53807'"),
        "bytes_per_tile": (624 * 1024, "[P] 624 KiB per tile, 897 MB per GC200"),
        "clock_hz": (1.33e9, "[P] MLPerf accelerator_frequency; tut6 README 6,681,766 cycles = 5,023.9 us"),
        "amp_macs_half": (64, "[D] M2000 1 PFLOPS FP16.16 / (4 IPUs x 2 x 1472 x 1.33 GHz)"),
        "amp_macs_half_fp32_partials": (32, "[A] 8 conv units x 4 (assembly exists only for 8 units; poplar.md 4.2)"),
        "amp_macs_float": (16, "[D] 62.4 TFLOPS fp32 (Pod128 datasheet / 128) / (2 x 1472 x 1.33 GHz)"),
        "amp_macs_quarter": (0, "[P] fp8 arrives with ipu21"),
        "ipu_link_bytes_per_s": (320e9, "[S] 10 IPU-Links, 320 GB/s per IPU"),
        "host_bytes_per_s": (64e9, "[S] PCIe Gen4 x16, 64 GB/s"),
        "gw_link_bytes_per_s": (2 * 100e9 / 8 / 4, "[A] 2 x 100 Gbit/s GW-Links per IPU-M2000 (as the Bow-2000 datasheet gives), shared by its 4 IPUs"),
    },
    "bow": {
        "tiles_per_ipu": (1472, "[P] Bow IPU, 5,888 cores per Bow-2000"),
        "bytes_per_tile": (624 * 1024, "[P] 624.0 kB per tile, 897.0 MB per IPU"),
        "clock_hz": (1.85e9, "[P] gc-flops 87.1078 TFLOPS at 1850 MHz"),
        "amp_macs_half": (64, "[D] Bow-2000 1.4 PFLOPS FP16.16 / (4 x 2 x 1472 x 1.85 GHz)"),
        "amp_macs_half_fp32_partials": (32, "[A] as ipu2"),
        "amp_macs_float": (16, "[P] gc-flops 87.1078 TFLOPS fp32 = 16 MAC/cycle/tile at 1850 MHz"),
        "amp_macs_quarter": (0, "[P] no fp8 on Bow"),
        "ipu_link_bytes_per_s": (320e9, "[S] as GC200"),
        "host_bytes_per_s": (2 * 12.5e9, "[P] 2 x 100 Gbps GW-Links per Bow-2000"),
        "gw_link_bytes_per_s": (2 * 100e9 / 8 / 4, "[P] Bow-2000 datasheet: 2 x 100 Gbit/s GW-Links, shared by its 4 IPUs"),
    },
    "ipu21": {
        "tiles_per_ipu": (1472, "[P] C600 (Mk2 IPU with FP8 support)"),
        "bytes_per_tile": (624 * 1024, "[P] 900 MB In-Processor-Memory per C600"),
        "clock_hz": (1.486e9, "[D] 280 TFLOPS fp16 / (2 x 64 x 1472): clock not published, assumes Mk2 MAC widths"),
        "amp_macs_half": (64, "[D] 280 TFLOPS fp16 at the derived clock"),
        "amp_macs_half_fp32_partials": (32, "[A] as ipu2"),
        "amp_macs_float": (16, "[D] 70 TFLOPS fp32 at the derived clock"),
        "amp_macs_quarter": (128, "[D] 560 TFLOPS fp8 at the derived clock"),
        "ipu_link_bytes_per_s": (128e9, "[P] 128 GB/s IPU-Link (64 GB/s each way)"),
        "host_bytes_per_s": (32e9, "[P] 2 x PCIe Gen4 x8"),
        "gw_link_bytes_per_s": (0.0, "[P] C600 is a PCIe card: no GW-Links"),
    },
}

#: Facts shared by every generation.
COMMON: dict[str, tuple[object, str]] = {
    "num_worker_contexts": (6, "[P] 6 hardware worker threads per tile; [T6]"),
    "exchange_bytes_per_cycle": (4, "[T6] tut6 exchange cost 143 and reduce exchange 49 need 4 B/cycle/tile"),
    "data_path_width_bits": (64, "[P] PopLibs popopsCycleEstimators.hpp: 64-bit data path"),
    "tiles_per_shared_exchange_bus": (2, "[P] PopLibs ExchangeEstimator asserts getTilesPerSharedExchangeBus() == 2"),
    "memcpy_bytes_per_cycle": (8, "[A] one 64-bit load/store pair per cycle for on-tile copies"),
    "instruction_bytes": (4, "[A] IPU instructions are 32-bit (64-bit for some)"),
    "global_sync_cycles": (600, "[A] third-party estimate of Target::getGlobalSyncCycles(); unpublished"),
}

ARCH_OF = {"ipu1": "ipu1", "ipu2": "ipu2", "bow": "ipu2", "ipu21": "ipu21"}
NAME_OF = {"ipu1": "GC2 (Mk1)", "ipu2": "GC200 (Mk2)", "bow": "Bow IPU", "ipu21": "C600 (IPU21)"}


def fact(version: str, quantity: str) -> object:
    """The value of ``quantity`` for IPU ``version`` (``ipu1``, ``ipu2``, ``bow``, ``ipu21``).

    Raises:
        KeyError: unknown version or quantity.
    """
    row = FACTS[version].get(quantity) or COMMON[quantity]
    return row[0]


def source(version: str, quantity: str) -> str:
    """Where the number behind ``fact(version, quantity)`` comes from."""
    row = FACTS[version].get(quantity) or COMMON[quantity]
    return row[1]


@dataclass(frozen=True)
class Target:
    """One IPU generation times ``num_ipus``: the hardware a graph is compiled for.

    All counts are per IPU unless named otherwise. Units: bytes, Hz, cycles, MACs per cycle
    per tile. Build one with :func:`target` (or ``IPUModel(...).createDevice().getTarget()``).
    """

    version: str                      # "ipu1" | "ipu2" | "bow" | "ipu21"
    num_ipus: int
    tiles_per_ipu: int
    bytes_per_tile: int
    clock_hz: float
    num_worker_contexts: int
    exchange_bytes_per_cycle: int
    memcpy_bytes_per_cycle: int
    data_path_width_bits: int
    tiles_per_shared_exchange_bus: int
    instruction_bytes: int
    global_sync_cycles: int
    min_ipu_sync_delay: int
    relative_sync_delay: bool          # False == IPUModel.RelativeSyncDelayType.NO_DELAY
    amp_macs: dict = field(hash=False, compare=False)  # element type name -> MACs/cycle/tile
    ipu_link_bytes_per_s: float = 0.0
    host_bytes_per_s: float = 0.0
    gw_link_bytes_per_s: float = 0.0   # per IPU, between IPU-Link domains (racks); 0 = none
    is_ipu_model: bool = True
    compile_ipu_code: bool = False
    target_type: str = "IPU_MODEL"    # "IPU" | "IPU_MODEL" | "CPU"

    @property
    def arch(self) -> str:
        """Poplar's target architecture string (``ipu1``, ``ipu2``, ``ipu21``)."""
        return ARCH_OF[self.version]

    @property
    def num_tiles(self) -> int:
        return self.num_ipus * self.tiles_per_ipu

    def vector_width(self, type_size: int) -> int:
        """Elements per data-path vector for an element of ``type_size`` bytes (float 2, half 4)."""
        return max(1, self.data_path_width_bits // 8 // type_size)

    def with_overrides(self, **changes) -> "Target":
        return dataclasses.replace(self, **changes)


def target(version: str = "ipu2", num_ipus: int = 1, **overrides) -> Target:
    """Build the :class:`Target` of ``num_ipus`` IPUs of one generation from :data:`FACTS`.

    Args:
        version: ``ipu1`` (GC2), ``ipu2`` (GC200, IPU-M2000), ``bow`` (Bow-2000) or ``ipu21`` (C600).
        num_ipus: IPUs in the target.
        overrides: any :class:`Target` field (e.g. ``tiles_per_ipu=4``).

    Raises:
        ValueError: unknown version.
    """
    if version not in FACTS:
        raise ValueError(f"Unknown IPU version '{version}': expected one of {', '.join(FACTS)}")
    f = lambda q: fact(version, q)  # noqa: E731
    t = Target(
        version=version, num_ipus=num_ipus,
        tiles_per_ipu=f("tiles_per_ipu"), bytes_per_tile=f("bytes_per_tile"), clock_hz=f("clock_hz"),
        num_worker_contexts=f("num_worker_contexts"), exchange_bytes_per_cycle=f("exchange_bytes_per_cycle"),
        memcpy_bytes_per_cycle=f("memcpy_bytes_per_cycle"), data_path_width_bits=f("data_path_width_bits"),
        tiles_per_shared_exchange_bus=f("tiles_per_shared_exchange_bus"), instruction_bytes=f("instruction_bytes"),
        global_sync_cycles=f("global_sync_cycles"), min_ipu_sync_delay=0, relative_sync_delay=True,
        amp_macs={"half": f("amp_macs_half"), "half_fp32_partials": f("amp_macs_half_fp32_partials"),
                  "float": f("amp_macs_float"), "quarter": f("amp_macs_quarter")},
        ipu_link_bytes_per_s=f("ipu_link_bytes_per_s"), host_bytes_per_s=f("host_bytes_per_s"),
        gw_link_bytes_per_s=f("gw_link_bytes_per_s"),
    )
    return dataclasses.replace(t, **overrides) if overrides else t


@dataclass(frozen=True)
class System:
    """A product: how many IPUs of which generation, and how they are linked."""

    name: str
    version: str
    num_ipus: int
    topology: str   # "single", "ladder" (IPU-Link ladder inside a machine), "torus" (Pod racks)
    source: str

    def target(self, num_ipus: int | None = None) -> Target:
        return target(self.version, num_ipus or self.num_ipus)

    @property
    def ipus_per_machine(self) -> int:
        """IPUs of one machine (IPU-M2000 / Bow-2000: 4; a C600 card: 1)."""
        return 1 if self.topology == "single" else min(4, self.num_ipus)

    @property
    def machines(self) -> int:
        """IPU-Machines (or cards) of the system."""
        return -(-self.num_ipus // self.ipus_per_machine)

    @property
    def ipu_link_domains(self) -> int:
        """Racks of at most 64 IPUs joined by IPU-Links (a 2D torus inside a Pod64 rack);
        collectives between racks cross GW-Links (``gcl.IPU_LINK_DOMAIN_IPUS``)."""
        return -(-self.num_ipus // 64)

    @property
    def gw_links(self) -> bool:
        """True when the system spans several IPU-Link domains joined by GW-Links."""
        return self.ipu_link_domains > 1


SYSTEMS: dict[str, System] = {s.name: s for s in [
    System("IPU-M2000", "ipu2", 4, "ladder", "[P] M2000 datasheet: 4 GC200, 1 PFLOPS FP16.16"),
    System("Bow-2000", "bow", 4, "ladder", "[P] Bow-2000 datasheet: 4 Bow IPUs, 1.4 PFLOPS"),
    System("C600", "ipu21", 1, "single", "[P] C600 datasheet: one IPU21 PCIe card"),
    System("IPU-POD16", "ipu2", 16, "torus", "[P] 4 x IPU-M2000"),
    System("IPU-POD64", "ipu2", 64, "torus", "[P] 16 x IPU-M2000"),
    System("Bow Pod16", "bow", 16, "torus", "[P] 4 x Bow-2000"),
    System("Bow Pod64", "bow", 64, "torus", "[P] 16 x Bow-2000"),
    System("Bow Pod256", "bow", 256, "torus", "[P] 64 x Bow-2000"),
    System("IPU-POD128", "ipu2", 128, "torus",
           "[P] IPU-POD128 datasheet: 2 IPU-POD64 racks (32 x IPU-M2000) joined by GW-Links"),
    System("IPU-POD256", "ipu2", 256, "torus",
           "[P] IPU-POD256 datasheet: 4 IPU-POD64 racks (64 x IPU-M2000) joined by GW-Links"),
    System("Bow Pod128", "bow", 128, "torus", "[P] 2 Bow Pod64 racks (32 x Bow-2000) joined by GW-Links"),
    System("Bow Pod512", "bow", 512, "torus", "[P] 8 Bow Pod64 racks (128 x Bow-2000) joined by GW-Links"),
    System("Bow Pod1024", "bow", 1024, "torus", "[P] 16 Bow Pod64 racks (256 x Bow-2000) joined by GW-Links"),
]}
