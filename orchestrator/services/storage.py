"""The storage preflight's judgement: the source's and the target's storage side by side, and what is wrong with it.

Pure logic over facts the probes gathered (`probes.MountFacts`, `probes.FsyncSample`, the database's durability
settings): no host is contacted here, so every rule is tested offline. Each finding names the failure it protects
against, taken from the post-mortems this project started from (docs/plan.md: storage preflight).

Kinds of finding and what they do:
- `slow`: the target's synchronous writes are much slower than the source's (the database would get slower);
- `durability`: the target trades durability for speed where the source did not (acknowledged writes could be lost);
- `space`: not enough free bytes or inodes for what will land there (always stops the preflight);
- `layout`: a filesystem known for hidden costs (NFS, FUSE, overlay, an ext4 image on a loop device, ZFS): reported,
  never blocking by itself; the measured fsync latency is what decides.
`slow` and `durability` warn or refuse as `preflight.storage` says.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Literal

from orchestrator.services.probes import FsyncSample, MountFacts

Side = Literal["source", "target"]
Kind = Literal["slow", "durability", "space", "layout"]

SPACE_MARGIN = 1.10

# What each finding protects against: the post-mortems in the project's seeds.
NFS_SYNC_WRITES = (
    "zfs-nfs-esxi-sync-writes: an NFS client that commits every write, on ZFS without a fast SLOG, wrote under 1 MiB/s"
)
NFS_STORAGE_NODE = (
    "course-review-storage-incident: VM disks on NFS over ZFS with its log on a failing HDD; 8.1 MB/s fdatasync "
    "writes, nfsd in D state, the service slow for two weeks"
)
NFS_DIRTY_PAGES = (
    "linkedin-slow-nfs-dirty-pages: writes to a slow NFS mount piled up as dirty pages until the database's own "
    "disk I/O stalled behind them"
)
LOOP_IMAGE = (
    "lxc-directory-storage-fsync: ext4 in an image file on ext4 (LXC directory storage) doubled fsync latency, "
    "40.8 ms against 18.9 ms on LVM"
)
ZFS_SINGLE_DISK = (
    "proxmox-zfs-vs-lvm-nvme-ru: ZFS on one NVMe with sync=standard made every write wait; 12 000 4K IOPS and "
    "26-90 % iowait until the disk moved to LVM"
)
DURABILITY_TRADE = (
    "zfs-nfs-esxi-sync-writes: sync=disabled was one of its speed fixes; acknowledged writes are then lost on a "
    "power cut or crash"
)
OUT_OF_SPACE = "a copy that fills the target's filesystem or its inode table half way through the window"

NETWORK_FILESYSTEMS = ("nfs", "nfs4", "cifs", "smb3", "smbfs", "glusterfs", "ceph", "9p", "virtiofs")
VOLATILE_FILESYSTEMS = ("tmpfs", "ramfs")
# Options that drop the write barriers fsync relies on.
NO_BARRIER_OPTIONS = ("nobarrier", "barrier=0")

# The database settings whose durability depends on fsync, and the value that is safe.
DURABLE_SETTINGS = {
    "innodb_flush_log_at_trx_commit": "1",
    "sync_binlog": "1",
    "innodb_doublewrite": "ON",
}
UNSAFE_FLUSH_METHODS = ("nosync",)


@dataclass(frozen=True)
class Finding:
    kind: Kind
    side: Side
    where: str
    text: str
    protects_against: str

    def blocks(self, policy: Literal["warn", "refuse"]) -> bool:
        return self.kind == "space" or (self.kind in ("slow", "durability") and policy == "refuse")

    def line(self) -> str:
        return f"{self.side} {self.where}: {self.text} (protects against {self.protects_against})"


@dataclass(frozen=True)
class Need:
    """What will land on one target path: bytes and entries (files and directories) from the source."""

    bytes: int = 0
    entries: int = 0


@dataclass
class SideFacts:
    """One host's storage: the filesystem under each role ('datadir', 'tree NAME'), the datadir's fsync sample and
    the database's durability settings (with where they were read: 'server' or 'option files')."""

    mounts: dict[str, MountFacts] = field(default_factory=dict)
    fsync: FsyncSample | None = None
    settings: dict[str, str] = field(default_factory=dict)
    settings_origin: str = "server"


@dataclass
class StorageReport:
    source: SideFacts
    target: SideFacts
    findings: list[Finding]
    fsync_ratio: float | None

    def blocking(self, policy: Literal["warn", "refuse"]) -> list[Finding]:
        return [finding for finding in self.findings if finding.blocks(policy)]

    def figures(self) -> dict[str, object]:
        """The report's JSON form (the preflight's result keeps it)."""

        def _side(facts: SideFacts) -> dict[str, object]:
            return {
                "mounts": {role: asdict(mount) for role, mount in facts.mounts.items()},
                "fsync": asdict(facts.fsync) if facts.fsync else None,
                "settings": facts.settings,
                "settings_origin": facts.settings_origin,
            }

        return {
            "source": _side(self.source),
            "target": _side(self.target),
            "fsync_ratio": self.fsync_ratio,
            "findings": [asdict(finding) for finding in self.findings],
        }


def layout_findings(side: Side, role: str, mount: MountFacts) -> list[Finding]:
    """What the filesystem under one path is known to cost."""
    where = f"{role} ({mount.path} on {mount.fstype} {mount.device} at {mount.mount_point})"
    found: list[Finding] = []

    def note(text: str, cause: str) -> None:
        found.append(Finding("layout", side, where, text, cause))

    fstype = mount.fstype
    if fstype in NETWORK_FILESYSTEMS:
        note(f"{fstype} is a network filesystem: every fsync is a round trip to its server", NFS_SYNC_WRITES)
        note("dirty pages bound for a slow network mount can stall the host's other writes", NFS_DIRTY_PAGES)
    if fstype.startswith("fuse"):
        note(f"{fstype}: a userspace filesystem; fsync costs what its daemon makes of it", NFS_STORAGE_NODE)
    if fstype == "overlay":
        note(
            "overlay (a container's layer): the first write to a file copies it up whole, and the layer may not "
            "outlive the container",
            LOOP_IMAGE,
        )
    if mount.device.startswith("/dev/loop"):
        backing = f" in the image {mount.loop_backing_file}" if mount.loop_backing_file else ""
        note(f"a filesystem on a loop device{backing}: two filesystem layers for every fsync", LOOP_IMAGE)
    if fstype == "zfs":
        note(
            f"ZFS (sync={mount.zfs_sync or 'unknown'}): sync writes go through the ZIL; without a fast SLOG they "
            "wait for the pool's disks",
            ZFS_SINGLE_DISK,
        )
    if "sync" in mount.options or "dirsync" in mount.options:
        note("mounted with 'sync': every write waits for the disk, not only the database's fsyncs", NFS_STORAGE_NODE)
    return found


def durability_findings(role: str, source: MountFacts | None, target: MountFacts) -> list[Finding]:
    """The target's filesystem gives up durability the source's kept."""
    where = f"{role} ({target.path} on {target.fstype} at {target.mount_point})"
    found: list[Finding] = []
    if target.zfs_sync == "disabled" and (source is None or source.zfs_sync != "disabled"):
        found.append(Finding("durability", "target", where, "ZFS sync=disabled: fsync returns before the data "
                             "is on disk", DURABILITY_TRADE))  # fmt: skip
    if target.fstype in VOLATILE_FILESYSTEMS and (source is None or source.fstype not in VOLATILE_FILESYSTEMS):
        found.append(Finding("durability", "target", where, f"{target.fstype} keeps everything in memory: the "
                             "data is gone at the next reboot", DURABILITY_TRADE))  # fmt: skip
    dropped = [option for option in NO_BARRIER_OPTIONS if option in target.options]
    if dropped and not (source is not None and any(option in source.options for option in dropped)):
        found.append(Finding("durability", "target", where, f"mounted with {', '.join(dropped)}: fsync no longer "
                             "waits for the disk's cache", DURABILITY_TRADE))  # fmt: skip
    return found


def _normal(name: str, value: str) -> str:
    value = value.strip()
    if name == "innodb_doublewrite":
        return "ON" if value.upper() in ("ON", "1", "TRUE", "FAST") else "OFF" if value else ""
    return value


def settings_findings(source: Mapping[str, str], target: Mapping[str, str], origin: str) -> list[Finding]:
    """A durability setting the target relaxes where the source had it safe (or where the source is unknown)."""
    found: list[Finding] = []
    for name, safe in DURABLE_SETTINGS.items():
        target_value = _normal(name, target.get(name, ""))
        source_value = _normal(name, source.get(name, ""))
        if not target_value or target_value == safe:
            continue
        if source_value and source_value != safe:
            continue  # the source already ran so: not a change the migration makes
        found.append(Finding(
            "durability", "target", f"database ({origin})",
            f"{name}={target_value} where the source has {source_value or 'it unset'}: committed transactions can "
            "be lost on a crash", DURABILITY_TRADE,
        ))  # fmt: skip
    method = target.get("innodb_flush_method", "").strip().lower()
    if method in UNSAFE_FLUSH_METHODS and source.get("innodb_flush_method", "").strip().lower() != method:
        found.append(Finding("durability", "target", f"database ({origin})", f"innodb_flush_method={method}: InnoDB "
                             "never calls fsync", DURABILITY_TRADE))  # fmt: skip
    return found


def fsync_ratio(source: FsyncSample | None, target: FsyncSample | None) -> float | None:
    if source is None or target is None:
        return None
    return round(target.p50_ms / max(source.p50_ms, 0.001), 2)


def slow_findings(
    source: FsyncSample | None, target: FsyncSample | None, target_mount: MountFacts | None, *,
    max_ratio: float, min_ms: float,
) -> list[Finding]:  # fmt: skip
    ratio = fsync_ratio(source, target)
    if ratio is None or target is None or source is None:
        return []
    if ratio <= max_ratio or target.p50_ms < min_ms:
        return []
    where = "datadir" + (f" ({target_mount.path} on {target_mount.fstype})" if target_mount else "")
    cause = LOOP_IMAGE if target_mount and target_mount.device.startswith("/dev/loop") else NFS_STORAGE_NODE
    return [Finding(
        "slow", "target", where,
        f"synchronous writes are {ratio}x slower than the source's (p50 {target.p50_ms} ms against "
        f"{source.p50_ms} ms, p99 {target.p99_ms} ms against {source.p99_ms} ms; limit {max_ratio}x): every "
        "commit of the migrated database would wait that much longer", cause,
    )]  # fmt: skip


def space_findings(role: str, mount: MountFacts, need: Need) -> list[Finding]:
    found: list[Finding] = []
    where = f"{role} ({mount.mount_point})"
    want_inodes = int(need.entries * SPACE_MARGIN)
    if mount.total_inodes and mount.free_inodes < want_inodes:
        found.append(Finding("space", "target", where, f"{mount.free_inodes} free inodes, {want_inodes} needed "
                             "(source files + 10%)", OUT_OF_SPACE))  # fmt: skip
    return found


def judge(
    source: SideFacts,
    target: SideFacts,
    needs: Mapping[str, Need],
    *,
    max_fsync_ratio: float,
    min_fsync_ms: float,
) -> StorageReport:
    """Every finding, source and target side by side. `needs`: per target mount point, what will land there."""
    findings: list[Finding] = []
    sides: tuple[tuple[Side, SideFacts], ...] = (("source", source), ("target", target))
    for side, facts in sides:
        for role, mount in facts.mounts.items():
            findings += layout_findings(side, role, mount)
    for role, mount in target.mounts.items():
        findings += durability_findings(role, source.mounts.get(role), mount)
    findings += settings_findings(source.settings, target.settings, target.settings_origin)
    findings += slow_findings(
        source.fsync, target.fsync, target.mounts.get("datadir"), max_ratio=max_fsync_ratio, min_ms=min_fsync_ms
    )
    seen_mounts: set[str] = set()
    for role, mount in target.mounts.items():
        if mount.mount_point in seen_mounts:
            continue
        seen_mounts.add(mount.mount_point)
        findings += space_findings(role, mount, needs.get(mount.mount_point, Need()))
    return StorageReport(source, target, findings, fsync_ratio(source.fsync, target.fsync))
