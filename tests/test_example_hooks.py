"""The example hooks shipped in hooks/ do what their comments say."""

from __future__ import annotations

import json
import os
import subprocess
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

HOOKS = Path(__file__).resolve().parents[1] / "hooks"


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MIGRATE_")}
    env.update(
        MIGRATE_PLAN_NAME="course-review",
        MIGRATE_RUN_ID="r1",
        MIGRATE_ELAPSED_SECONDS="12.5",
        MIGRATE_STATE="running",
        MIGRATE_DRY_RUN="0",
        MIGRATE_STEP="cutover",
    )
    env.update(extra)
    return env


def test_notify_webhook_posts_slack_compatible_json() -> None:
    received: list[dict] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            received.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
            self.send_response(200)
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/hook"
        res = subprocess.run(
            [str(HOOKS / "notify-webhook")],
            capture_output=True,
            text=True,
            timeout=20,
            env=_env(MIGRATE_EVENT="on-failure", MIGRATE_ERROR='lock "not" obtained', MIGRATE_WEBHOOK_URL=url),
        )
        assert res.returncode == 0, res.stderr
        assert received == [
            {"text": 'migration course-review FAILED at cutover: lock "not" obtained (run r1, state running)'}
        ]
    finally:
        server.shutdown()
        server.server_close()


def test_notify_webhook_without_url_prints_the_message() -> None:
    res = subprocess.run(
        [str(HOOKS / "notify-webhook")],
        capture_output=True,
        text=True,
        timeout=20,
        env=_env(MIGRATE_EVENT="on-success", MIGRATE_DRY_RUN="1"),
    )
    assert res.returncode == 0
    assert res.stdout.strip() == "[dry-run] migration course-review done in 12.5s (run r1)"


def test_maintenance_page_toggles_the_flag_through_the_given_command(tmp_path: Path) -> None:
    flag = tmp_path / "maintenance.flag"
    env = _env(MAINTENANCE_SSH="sh -c", MAINTENANCE_FLAG=str(flag))
    up = subprocess.run([str(HOOKS / "maintenance-page")], env={**env, "MIGRATE_EVENT": "before-cutover"}, timeout=20)
    assert up.returncode == 0 and flag.exists()
    down = subprocess.run([str(HOOKS / "maintenance-page")], env={**env, "MIGRATE_EVENT": "on-rollback"}, timeout=20)
    assert down.returncode == 0 and not flag.exists()
