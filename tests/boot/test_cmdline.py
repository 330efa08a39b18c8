"""Kernel command lines as the kernel reads them: the last occurrence wins, a bare flag is on."""
from tuner.boot import cmdline


def test_value_of_last_occurrence_flags_and_absence():
    toks = cmdline.parse('BOOT_IMAGE=/vmlinuz ro quiet iommu=on iommu=pt "acpi_osi=Linux x"')
    assert cmdline.value_of(toks, "iommu") == "pt"
    assert cmdline.value_of(toks, "quiet") is True
    assert cmdline.value_of(toks, "hugepages") is None
    assert cmdline.value_of(toks, "acpi_osi") == "Linux x"


def test_with_changes_replaces_every_occurrence_removes_and_drops_loader_tokens():
    toks = cmdline.parse("BOOT_IMAGE=/vmlinuz root=UUID=1 ro iommu=on quiet iommu=off")
    out = cmdline.with_changes(toks, {"iommu": "pt", "quiet": None, "hugepages": 16})
    assert out == ["root=UUID=1", "ro", "iommu=pt", "hugepages=16"]
    assert cmdline.missing(out, {"iommu": "pt", "hugepages": 16, "quiet": None}) == {}
    assert cmdline.missing(toks, {"iommu": "pt"}) == {"iommu": "off"}
