"""The storage preflight offline: its probes' parses from fixtures, and the findings judged from facts."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from orchestrator.services import probes, storage
from orchestrator.services.probes import FsyncSample, MountFacts
from orchestrator.transports.ssh import TransportError

FIXTURES = Path(__file__).parent / "fixtures" / "storage"


def fixture(name: str) -> str:
    return (FIXTURES / name).read_text()


# --- parses -----------------------------------------------------------------------------------------------------


def test_parse_mount_reads_an_nfs_mount() -> None:
    mount = probes.parse_mount(fixture("mount_nfs.txt"))
    assert (mount.fstype, mount.device, mount.mount_point) == ("nfs4", "filer:/export/db", "/var/lib/mysql")
    assert mount.free_bytes == 262144 * 4096 and mount.free_inodes == 60000 and mount.total_inodes == 65536
    assert "hard" in mount.options


def test_parse_mount_reads_a_loop_device_and_its_image() -> None:
    mount = probes.parse_mount(fixture("mount_loop.txt"))
    assert mount.device == "/dev/loop3" and mount.loop_backing_file.endswith("vm-101-disk-0.raw")
    assert "sync" in mount.options


def test_parse_mount_reads_the_zfs_sync_property() -> None:
    assert probes.parse_mount(fixture("mount_zfs_sync_disabled.txt")).zfs_sync == "disabled"


def test_parse_mount_refuses_output_without_a_filesystem() -> None:
    with pytest.raises(TransportError, match="findmnt"):
        probes.parse_mount("path=/x\nblocksize=4096\n", "/x")


def test_parse_fsync_gives_percentiles_in_milliseconds() -> None:
    sample = probes.parse_fsync(fixture("fsync.txt"))
    assert sample.writes == 10 and sample.method == "fsync"
    assert sample.p50_ms == 0.105  # sorted: 95 97 98 99 101 105 110 120 130 4000 → index 5
    assert sample.p99_ms == 4.0 and sample.max_ms == 4.0


def test_parse_fsync_falls_back_to_dd_mean() -> None:
    sample = probes.parse_fsync(fixture("fsync_dd.txt"))
    assert (sample.writes, sample.method, sample.p50_ms) == (200, "dd", 8.0)


def test_parse_fsync_without_a_measurement_says_so() -> None:
    with pytest.raises(TransportError, match="no fsync measurement for /d"):
        probes.parse_fsync("python3: can't open\n", "/d")


def test_parse_option_file_normalizes_names() -> None:
    found = probes.parse_option_file(fixture("my_print_defaults.txt"))
    assert found["innodb_flush_log_at_trx_commit"] == "2"
    assert found["sync_binlog"] == "0"  # loose- prefix dropped
    assert found["innodb_doublewrite"] == "0" and found["innodb_flush_method"] == "O_DIRECT"


def test_mount_and_fsync_probes_run_here_and_clean_up(tmp_path: Path) -> None:
    """The real commands on this machine: a path that does not exist yet is judged by its nearest ancestor, and the
    fsync sample leaves nothing behind."""
    mount = probes.parse_mount(_bash(probes.mount_facts(str(tmp_path / "not" / "yet")).command))
    assert mount.path == str(tmp_path) and mount.fstype and mount.free_bytes > 0
    sample = probes.parse_fsync(_bash(probes.fsync_latency(str(tmp_path), count=20, seconds=5).command))
    assert sample.writes == 20 and 0 < sample.p50_ms <= sample.p99_ms <= sample.max_ms
    assert list(tmp_path.iterdir()) == []
    counts = probes.parse_counts(_bash(probes.entry_counts([str(FIXTURES), str(tmp_path / "none")]).command))
    assert counts == {str(FIXTURES): len(list(FIXTURES.iterdir())) + 1}


def _bash(command: str) -> str:
    return subprocess.run(["bash", "-c", command], capture_output=True, text=True, check=True, timeout=60).stdout


# --- findings ---------------------------------------------------------------------------------------------------


def ext4(path: str = "/var/lib/mysql") -> MountFacts:
    return MountFacts(path=path, mount_point="/", device="/dev/nvme0n1p2", fstype="ext4", options=("rw",),
                      free_bytes=10**12, free_inodes=10**7, total_inodes=10**7)  # fmt: skip


def sample(p50: float, p99: float | None = None) -> FsyncSample:
    return FsyncSample(200, p50, p99 if p99 is not None else p50 * 2, p50 * 3)


def judge(source: storage.SideFacts, target: storage.SideFacts, **needs: storage.Need) -> storage.StorageReport:
    return storage.judge(source, target, {"/": storage.Need(**{}), **needs}, max_fsync_ratio=3.0, min_fsync_ms=1.0)


def side(mount: MountFacts | None = None, fsync: FsyncSample | None = None, **settings: str) -> storage.SideFacts:
    return storage.SideFacts(mounts={"datadir": mount or ext4()}, fsync=fsync or sample(0.5), settings=settings)


def kinds(report: storage.StorageReport) -> list[str]:
    return [finding.kind for finding in report.findings]


def test_equal_storage_has_no_finding() -> None:
    report = judge(side(), side(fsync=sample(0.6)))
    assert report.findings == [] and report.fsync_ratio == 1.2
    assert report.blocking("refuse") == []


def test_a_much_slower_target_is_slow_and_the_policy_decides() -> None:
    report = judge(side(fsync=sample(0.5)), side(fsync=sample(10.0, 40.0)))
    assert kinds(report) == ["slow"] and report.fsync_ratio == 20.0
    slow = report.findings[0]
    assert slow.side == "target" and "20.0x slower" in slow.text and "p99 40.0 ms" in slow.text
    assert slow.protects_against  # every finding cites what it protects against
    assert report.blocking("warn") == [] and report.blocking("refuse") == [slow]


def test_a_fast_target_is_never_slow_whatever_the_ratio() -> None:
    """A tmpfs-fast source makes any disk look slow in ratio: under min_fsync_ms it is not a finding."""
    assert judge(side(fsync=sample(0.001)), side(fsync=sample(0.5))).findings == []


def test_the_loop_image_cause_is_cited_for_a_slow_loop_target() -> None:
    loop = probes.parse_mount(fixture("mount_loop.txt"))
    report = judge(side(), side(mount=loop, fsync=sample(30.0)))
    slow = [f for f in report.findings if f.kind == "slow"]
    assert slow and slow[0].protects_against == storage.LOOP_IMAGE
    assert any(f.kind == "layout" and "loop device in the image" in f.text for f in report.findings)
    assert any(f.kind == "layout" and "'sync'" in f.text for f in report.findings)


def test_nfs_under_the_datadir_cites_sync_writes_and_dirty_pages() -> None:
    report = judge(side(), side(mount=probes.parse_mount(fixture("mount_nfs.txt"))))
    causes = {f.protects_against for f in report.findings if f.kind == "layout"}
    assert causes == {storage.NFS_SYNC_WRITES, storage.NFS_DIRTY_PAGES}
    assert report.blocking("refuse") == []  # a layout alone never blocks: the measured latency decides


def test_zfs_sync_disabled_on_the_target_trades_durability() -> None:
    report = judge(side(), side(mount=probes.parse_mount(fixture("mount_zfs_sync_disabled.txt"))))
    durability = [f for f in report.findings if f.kind == "durability"]
    assert len(durability) == 1 and "sync=disabled" in durability[0].text
    assert durability[0].protects_against == storage.DURABILITY_TRADE
    assert report.blocking("refuse") == durability and report.blocking("warn") == []


def test_zfs_sync_disabled_on_both_sides_is_not_a_change() -> None:
    zfs = probes.parse_mount(fixture("mount_zfs_sync_disabled.txt"))
    assert "durability" not in kinds(judge(side(mount=zfs), side(mount=zfs)))


def test_tmpfs_target_loses_data_at_reboot() -> None:
    tmpfs = MountFacts(path="/var/lib/mysql", mount_point="/var/lib/mysql", device="tmpfs", fstype="tmpfs")
    assert next(f.text for f in judge(side(), side(mount=tmpfs)).findings if f.kind == "durability").startswith(
        "tmpfs keeps everything in memory"
    )


def test_relaxed_database_settings_on_the_target_are_named() -> None:
    source = side(innodb_flush_log_at_trx_commit="1", sync_binlog="1", innodb_doublewrite="ON")
    target = side(innodb_flush_log_at_trx_commit="2", sync_binlog="0", innodb_doublewrite="0",
                  innodb_flush_method="nosync")  # fmt: skip
    texts = [f.text for f in judge(source, target).findings if f.kind == "durability"]
    assert any(t.startswith("innodb_flush_log_at_trx_commit=2 where the source has 1") for t in texts)
    assert any(t.startswith("sync_binlog=0 where the source has 1") for t in texts)
    assert any(t.startswith("innodb_doublewrite=OFF") for t in texts)
    assert any("nosync" in t for t in texts)


def test_a_setting_the_source_already_relaxed_is_not_a_finding() -> None:
    """sync_binlog=0 on both (MariaDB's default): the migration changes nothing."""
    report = judge(side(sync_binlog="0"), side(sync_binlog="0", innodb_flush_log_at_trx_commit="1"))
    assert report.findings == []


def test_too_few_inodes_always_blocks() -> None:
    loop = probes.parse_mount(fixture("mount_loop.txt"))  # 20 inodes free
    report = storage.judge(side(), side(mount=loop, fsync=sample(0.5)), {"/srv/ct/101": storage.Need(10, 100)},
                           max_fsync_ratio=3.0, min_fsync_ms=1.0)  # fmt: skip
    space = [f for f in report.findings if f.kind == "space"]
    assert len(space) == 1 and "20 free inodes, 110 needed" in space[0].text
    assert report.blocking("warn") == space


def test_figures_are_plain_json() -> None:
    import json

    report = judge(side(), side(fsync=sample(10.0)))
    figures = json.loads(json.dumps(report.figures()))
    assert figures["target"]["fsync"]["p50_ms"] == 10.0 and figures["findings"][0]["kind"] == "slow"
