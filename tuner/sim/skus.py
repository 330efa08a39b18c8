"""Simulated GPU models. H200 numbers are real readings (docs/readings/h200-probe-2026-11-29.json);
RTX 4090 numbers are its public specs and what NVML reports on one (GeForce: no app clocks, no ECC
by default, VF offsets supported). Model constants are tuned so the demo's story holds (see model.py).

The H200's limits are the real part's; its thermal and boost behaviour is not (the lent H200 is
read-only: nothing measured its throughput against power or clocks). `r_thermal` makes sustained
draw above ~600 W reach the 87 degC slowdown, an under-cooled chassis, so the demo's search finds
a lower power limit with a pinned clock (+20.5% at 650 W and 1,740 MHz, seed 1). The shipped
`h200` profile keeps the driver defaults for that reason (host_profiles/h200.yaml says so too).
"""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Sku:
    name: str
    marketing_name: str
    pci_device_id: int
    pci_subsys: int  # subsystem device id (vendor 0x10de)
    pci_class: int
    revision: int
    pcie_gen: int
    pcie_width: int
    memory_total: int  # bytes
    gr_min: int
    gr_max: int
    gr_step: int
    mem_clocks: tuple[int, ...]  # highest first, as NVML lists them
    power_min_w: int
    power_max_w: int
    power_default_w: int
    gpc_offset_range: tuple[int, int]  # NVML min/max VF offset; (0, 0) = unsupported
    mem_offset_range: tuple[int, int]
    app_clocks: bool  # nvmlDeviceSetApplicationsClocks supported
    ecc: bool
    nvlink: bool
    supported_events: int
    temp_slowdown: int
    temp_shutdown: int
    temp_gpu_max: int
    temp_mem_max: int
    idle_temp: int
    idle_power_w: float
    video_clock: int
    bar_sizes: tuple[int, int, int]  # BAR0, BAR1, BAR3 in bytes
    # -- performance / power / thermal model ----------------------------------------------------
    base_throughput: float  # tok/s at gr_max / top memory clock with no losses
    compute_fraction: float  # share of time that scales with the graphics clock at the top clocks
    p_static_w: float
    p_mem_top_w: float
    p_dyn_top_w: float  # dynamic power at gr_max with offset 0
    v_min: float
    v_max: float
    v_gamma: float  # V(f) curvature: power rises steeply near the top clock
    t_ambient: float
    r_thermal: float  # degC per W
    dither_loss: float  # boost controller hunting under the power cap
    slowdown_clock_frac: float  # HW slowdown cuts the clock to this fraction
    slowdown_efficiency: float  # throughput kept while slowed (stalls on top of the lower clock)
    brake_penalty: float  # throughput kept when the power brake holds a pinned clock down
    unstable_over: float  # P(f) > limit * (1 + this) with a pinned clock is unstable
    gpc_margin_range: tuple[int, int] = (0, 0)  # per-chip stable GPC offset (seeded)
    mem_margin_range: tuple[int, int] = (0, 0)
    default_bdfs: tuple[str, ...] = field(default_factory=tuple)
    vm_bdfs: tuple[str, ...] = field(default_factory=tuple)
    unit: str = "tok/s"

    def graphics_clocks(self) -> list[int]:
        """Supported graphics clocks, highest first (NVML's order)."""
        return list(range(self.gr_max, self.gr_min - 1, -self.gr_step))

    @property
    def mem_top(self) -> int:
        return self.mem_clocks[0]


H200 = Sku(
    name="h200", marketing_name="NVIDIA H200", pci_device_id=0x2335, pci_subsys=0x18BF,
    pci_class=0x030200, revision=0xA1, pcie_gen=5, pcie_width=16,
    memory_total=150_109_880_320, gr_min=345, gr_max=1980, gr_step=15, mem_clocks=(3201, 2201),
    power_min_w=200, power_max_w=700, power_default_w=700,
    gpc_offset_range=(0, 0), mem_offset_range=(0, 0), app_clocks=True, ecc=True, nvlink=True,
    supported_events=65439, temp_slowdown=87, temp_shutdown=92, temp_gpu_max=85, temp_mem_max=95,
    idle_temp=36, idle_power_w=86.8, video_clock=1545,
    bar_sizes=(16 << 20, 256 << 30, 32 << 20),
    base_throughput=3000.0, compute_fraction=0.7,
    p_static_w=70.0, p_mem_top_w=90.0, p_dyn_top_w=660.0,
    v_min=0.70, v_max=1.05, v_gamma=4.0,
    t_ambient=30.0, r_thermal=0.095, dither_loss=0.05,
    slowdown_clock_frac=0.5, slowdown_efficiency=0.3, brake_penalty=0.7, unstable_over=0.08,
    default_bdfs=("0000:18:00.0", "0000:2a:00.0", "0000:3a:00.0", "0000:5d:00.0",
                  "0000:9a:00.0", "0000:ab:00.0", "0000:ba:00.0", "0000:db:00.0"),
    vm_bdfs=tuple(f"0000:00:{6 + i:02x}.0" for i in range(8)),
)

RTX4090 = Sku(
    name="rtx4090", marketing_name="NVIDIA GeForce RTX 4090", pci_device_id=0x2684,
    pci_subsys=0x167C, pci_class=0x030000, revision=0xA1, pcie_gen=4, pcie_width=16,
    memory_total=25_757_220_864, gr_min=210, gr_max=3105, gr_step=15,
    mem_clocks=(10501, 10251, 5001, 810, 405),
    power_min_w=150, power_max_w=600, power_default_w=450,
    gpc_offset_range=(-1000, 1500), mem_offset_range=(-1000, 2000), app_clocks=False, ecc=False,
    nvlink=False, supported_events=0xC09C, temp_slowdown=87, temp_shutdown=92, temp_gpu_max=88,
    temp_mem_max=95, idle_temp=34, idle_power_w=21.0, video_clock=1965,
    bar_sizes=(16 << 20, 32 << 30, 32 << 20),
    base_throughput=1200.0, compute_fraction=0.7,
    p_static_w=25.0, p_mem_top_w=60.0, p_dyn_top_w=540.0,
    v_min=0.88, v_max=1.10, v_gamma=3.0,
    t_ambient=30.0, r_thermal=0.14, dither_loss=0.05,
    slowdown_clock_frac=0.5, slowdown_efficiency=0.3, brake_penalty=0.7, unstable_over=0.08,
    gpc_margin_range=(150, 200), mem_margin_range=(800, 1200),
    default_bdfs=tuple(f"0000:{b:02x}:00.0" for b in (1, 2, 0x41, 0x42, 0x81, 0x82, 0xC1, 0xC2)),
    vm_bdfs=tuple(f"0000:00:{6 + i:02x}.0" for i in range(8)),
    unit="tok/s",
)

SKUS: dict[str, Sku] = {s.name: s for s in (H200, RTX4090)}


def get_sku(name: str) -> Sku:
    from tuner.errors import BadInput

    try:
        return SKUS[name]
    except KeyError:
        raise BadInput(f"--sku: expected one of {', '.join(SKUS)}, got {name!r}") from None
