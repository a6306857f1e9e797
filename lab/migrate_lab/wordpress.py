"""The WordPress lab (`lab up --app wordpress`): Debian's nginx, php8.2-fpm and wordpress on each lab host.

Per host, all under <host>/ and started without systemd:
    nginx/nginx.conf      listens on the host's loopback address, the app's internal port (behind HAProxy); the
                          write fence (503 while <host>/app/FENCED exists); /fpm-ping → php-fpm's ping
    php-fpm/pool.conf     a pool of its own: socket in run/, pid file in run/, logs in log/
    wordpress/config.php  the host's WordPress configuration: its MariaDB, its uploads tree, its URLs; Debian's
                          /etc/wordpress/config-<name>.php only requires it. nginx picks that <name> with the
                          WORDPRESS_CONFIG fastcgi_param: both hosts serve the same site name, so the Host header
                          cannot tell them apart.
    wp-content/           WP_CONTENT_DIR: plugins and themes from the package, uploads → <host>/uploads

WordPress is installed on the source offline (PHP's command line, wp_install), with a permalink structure (so
`/wp-json/` routes) and an application password for the REST clients, kept in lab.env like every lab secret. Its
tables live in the lab's database (prefix wp_): the migration moves them with everything else.

The lab runs nginx's workers and the php-fpm pool as root: the lab lives in private temporary directories (a
test's lives under a 0700 directory) that www-data could not enter. A real server runs them as www-data.
"""

from __future__ import annotations

import hashlib
import os
import secrets
import subprocess
from pathlib import Path

from migrate_lab.mariadb import q
from migrate_lab.state import HostState, LabState

APP_NAME = "wordpress"
WP_ROOT = Path("/usr/share/wordpress")
DEBIAN_CONFIG_DIR = Path("/etc/wordpress")
PACKAGE_CONTENT = WP_ROOT / "wp-content"
ADMIN_USER = "labadmin"
ADMIN_PASSWORD_ENV = "LAB_WP_ADMIN_PASSWORD"
APP_PASSWORD_ENV = "LAB_WP_APP_PASSWORD"
TABLE_PREFIX = "wp_"
FPM_PING = "/fpm-ping"
UPLOAD_MAX = "16M"


class WordPressError(RuntimeError):
    """A part of the WordPress stack could not be set up; the message names it and its log."""


# --- where things live ---------------------------------------------------------------------------------------


def config_name(state: LabState, host: HostState) -> str:
    """The WORDPRESS_CONFIG value of this host: unique per lab and host ([a-zA-Z0-9-]+, as Debian requires)."""
    digest = hashlib.sha256(state.dir.encode()).hexdigest()[:10]
    return f"migratelab-{digest}-{host.name}"


def debian_config(state: LabState, host: HostState) -> Path:
    return DEBIAN_CONFIG_DIR / f"config-{config_name(state, host)}.php"


def nginx_dir(host: HostState) -> Path:
    return host.path / "nginx"


def nginx_conf(host: HostState) -> Path:
    return nginx_dir(host) / "nginx.conf"


def nginx_pid_file(host: HostState) -> Path:
    return host.run_dir / "nginx.pid"


def fpm_conf(host: HostState) -> Path:
    return host.path / "php-fpm" / "php-fpm.conf"


def fpm_pid_file(host: HostState) -> Path:
    return host.run_dir / "php-fpm.pid"


def fpm_socket(host: HostState) -> Path:
    return host.run_dir / "php-fpm.sock"


def wp_config(host: HostState) -> Path:
    return host.path / "wordpress" / "config.php"


def content_dir(host: HostState) -> Path:
    return host.path / "wp-content"


def site_url(state: LabState) -> str:
    """What WordPress calls itself on both hosts: the name clients resolve, on the front door's port."""
    name = next((r for r in state.records if r.startswith("www.")), f"www.{state.zone}")
    return f"http://{name}:{state.source.app_port}"


# --- configuration files -------------------------------------------------------------------------------------


def nginx_text(state: LabState, host: HostState) -> str:
    tmp = nginx_dir(host) / "tmp"
    return f"""# nginx of the WordPress lab's {host.name}: written by `migrate lab up --app wordpress`.
user root;
worker_processes 1;
pid {nginx_pid_file(host)};
error_log {host.log_dir / "nginx-error.log"};
events {{ worker_connections 256; }}
http {{
  include /etc/nginx/mime.types;
  default_type application/octet-stream;
  access_log {host.log_dir / "nginx-access.log"};
  client_body_temp_path {tmp}/body;
  fastcgi_temp_path {tmp}/fastcgi;
  proxy_temp_path {tmp}/proxy;
  uwsgi_temp_path {tmp}/uwsgi;
  scgi_temp_path {tmp}/scgi;
  client_max_body_size {UPLOAD_MAX};
  server {{
    listen {host.address}:{host.app_listen_port};
    server_name _;
    root {WP_ROOT};
    index index.php;

    # The write fence (maintenance for writes): while the flag file exists every request that may write is
    # answered 503 before PHP sees it; reads go on. `migrate` turns it on and off with touch / rm.
    set $fence "";
    if (-f {host.fence_file}) {{ set $fence "on"; }}
    if ($request_method ~ ^(GET|HEAD|OPTIONS)$) {{ set $fence ""; }}
    if ($fence = "on") {{ return 503 '{{"error": "fenced"}}\\n'; }}

    location = {FPM_PING} {{
      access_log off;
      include /etc/nginx/fastcgi_params;
      fastcgi_param SCRIPT_NAME {FPM_PING};
      fastcgi_param SCRIPT_FILENAME {FPM_PING};
      fastcgi_pass unix:{fpm_socket(host)};
    }}
    # Uploaded media, straight from the host's uploads tree; never run as PHP.
    location /wp-content/uploads/ {{
      alias {host.uploads}/;
      location ~ \\.php$ {{ return 403; }}
    }}
    location /wp-content/ {{ alias {content_dir(host)}/; }}
    location / {{ try_files $uri $uri/ /index.php?$args; }}
    location ~ \\.php$ {{
      try_files $uri =404;
      include /etc/nginx/fastcgi_params;
      fastcgi_param SCRIPT_FILENAME $document_root$fastcgi_script_name;
      fastcgi_param HTTP_HOST $http_host;
      fastcgi_param WORDPRESS_CONFIG {config_name(state, host)};
      fastcgi_pass unix:{fpm_socket(host)};
      fastcgi_read_timeout 120s;
    }}
  }}
}}
"""


def fpm_text(host: HostState) -> str:
    return f"""; php-fpm of the WordPress lab's {host.name}: written by `migrate lab up --app wordpress`.
[global]
pid = {fpm_pid_file(host)}
error_log = {host.log_dir / "php-fpm.log"}
daemonize = yes

[wordpress]
user = root
group = root
listen = {fpm_socket(host)}
pm = dynamic
pm.max_children = 6
pm.start_servers = 2
pm.min_spare_servers = 1
pm.max_spare_servers = 3
ping.path = {FPM_PING}
ping.response = pong
catch_workers_output = yes
php_admin_flag[log_errors] = on
php_admin_value[error_log] = {host.log_dir / "php-error.log"}
php_admin_value[upload_max_filesize] = {UPLOAD_MAX}
php_admin_value[post_max_size] = {UPLOAD_MAX}
; configuration edits (the lab's plan, a migration) are seen at once, not after opcache's revalidation delay
php_admin_value[opcache.revalidate_freq] = 0
"""


def php_str(value: str) -> str:
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


def wp_config_text(state: LabState, host: HostState, salts: dict[str, str]) -> str:
    password = state.secrets()[state.app_password_env]
    url = site_url(state)
    keys = "\n".join(f"define({php_str(k)}, {php_str(v)});" for k, v in salts.items())
    return f"""<?php
// WordPress of the lab's {host.name}: its own database and uploads tree.
define('DB_NAME', {php_str(state.db_name)});
define('DB_USER', {php_str(state.app_user)});
define('DB_PASSWORD', {php_str(password)});
define('DB_HOST', {php_str(f"{host.address}:{host.db_port}")});
define('DB_CHARSET', 'utf8mb4');
$table_prefix = {php_str(TABLE_PREFIX)};
define('WP_HOME', {php_str(url)});
define('WP_SITEURL', {php_str(url)});
define('WP_CONTENT_DIR', {php_str(str(content_dir(host)))});
define('WP_CONTENT_URL', {php_str(url + "/wp-content")});
// Application passwords over plain HTTP (the lab has no TLS) need a local environment.
define('WP_ENVIRONMENT_TYPE', 'local');
define('WP_HTTP_BLOCK_EXTERNAL', true);
define('DISABLE_WP_CRON', true);
define('AUTOMATIC_UPDATER_DISABLED', true);
define('FS_METHOD', 'direct');
{keys}
"""


SALT_NAMES = (
    "AUTH_KEY", "SECURE_AUTH_KEY", "LOGGED_IN_KEY", "NONCE_KEY", "AUTH_SALT", "SECURE_AUTH_SALT", "LOGGED_IN_SALT",
    "NONCE_SALT",
)  # fmt: skip


def _write(path: Path, text: str, mode: int = 0o644) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(fd, "w") as out:
        out.write(text)
    tmp.chmod(mode)
    tmp.replace(path)


def _salts(state: LabState) -> dict[str, str]:
    """The keys and salts, the same on both hosts (a session made on one stays valid on the other): made once."""
    path = state.path / "wordpress-salts"
    if not path.exists():
        _write(path, "\n".join(f"{n}={secrets.token_urlsafe(48)}" for n in SALT_NAMES) + "\n", 0o600)
    pairs = (line.partition("=") for line in path.read_text().splitlines() if "=" in line)
    return {k: v for k, _, v in pairs}


def write_host(state: LabState, host: HostState) -> None:
    """Every configuration file of the host's stack, and its start/stop scripts (replacing the demo app's)."""
    for sub in ("body", "fastcgi", "proxy", "uwsgi", "scgi"):
        (nginx_dir(host) / "tmp" / sub).mkdir(parents=True, exist_ok=True)
    _write(nginx_conf(host), nginx_text(state, host))
    _write(fpm_conf(host), fpm_text(host))
    _write(wp_config(host), wp_config_text(state, host, _salts(state)), 0o600)
    DEBIAN_CONFIG_DIR.mkdir(parents=True, exist_ok=True)
    _write(debian_config(state, host), f"<?php\nrequire {php_str(str(wp_config(host)))};\n", 0o600)
    content = content_dir(host)
    content.mkdir(parents=True, exist_ok=True)
    host.uploads.mkdir(parents=True, exist_ok=True)
    for name, to in (("plugins", PACKAGE_CONTENT / "plugins"), ("themes", PACKAGE_CONTENT / "themes")):
        _symlink(content / name, to)
    _symlink(content / "uploads", host.uploads)
    for name, text in (("app-start", start_script(state, host)), ("app-stop", stop_script(host))):
        _write(host.bin_dir / name, text, 0o755)


def _symlink(link: Path, to: Path) -> None:
    if link.is_symlink() and Path(os.readlink(link)) == to:
        return
    if link.is_symlink():
        link.unlink()
    link.symlink_to(to)


def remove_host_configs(state: LabState) -> None:
    """The lab's files outside its directory: Debian's per-site configs in /etc/wordpress."""
    for host in (state.source, state.target):
        debian_config(state, host).unlink(missing_ok=True)


# --- start and stop ------------------------------------------------------------------------------------------


def _running_sh(name: str, pid_file: Path, marker: Path) -> str:
    return f"""{name}() {{
  local pid
  pid=$(cat {q(pid_file)} 2>/dev/null) || return 1
  [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null || return 1
  tr '\\0' ' ' < "/proc/$pid/cmdline" 2>/dev/null | grep -qF -- {q(str(marker))} || return 1
  echo "$pid"
}}
"""


def start_script(state: LabState, host: HostState) -> str:
    ping = f"http://{host.address}:{host.app_listen_port}{FPM_PING}"
    return f"""#!/bin/bash
# Starts php-fpm and nginx of {host.name} unless they run; returns once php-fpm answers its ping through nginx.
set -uo pipefail
{_running_sh("fpm_running", fpm_pid_file(host), fpm_conf(host))}
{_running_sh("nginx_running", nginx_pid_file(host), nginx_conf(host))}
mkdir -p {q(host.run_dir)} {q(host.log_dir)} {q(host.app_dir)}
if ! fpm_running >/dev/null; then
  rm -f {q(fpm_pid_file(host))}
  /usr/sbin/php-fpm8.2 --allow-to-run-as-root --fpm-config {q(fpm_conf(host))} \\
    || {{ echo "app-start: php-fpm of {host.name} failed; see {host.log_dir / "php-fpm.log"}" >&2; exit 1; }}
fi
if ! nginx_running >/dev/null; then
  rm -f {q(nginx_pid_file(host))}
  /usr/sbin/nginx -c {q(nginx_conf(host))} -e {q(host.log_dir / "nginx-error.log")} \\
    || {{ echo "app-start: nginx of {host.name} failed; see {host.log_dir / "nginx-error.log"}" >&2; exit 1; }}
fi
for _ in $(seq 1 300); do
  if [ "$(curl -s --max-time 1 {q(ping)} 2>/dev/null)" = pong ]; then exit 0; fi
  sleep 0.1
done
echo "app-start: php-fpm of {host.name} did not answer {ping} within 30 s; see {host.log_dir}" >&2
exit 1
"""


def stop_script(host: HostState) -> str:
    return f"""#!/bin/bash
# Stops nginx and php-fpm of {host.name} gracefully (SIGQUIT: requests in flight finish); returns once both are gone.
set -uo pipefail
{_running_sh("fpm_running", fpm_pid_file(host), fpm_conf(host))}
{_running_sh("nginx_running", nginx_pid_file(host), nginx_conf(host))}
stop() {{
  local pid=$1
  kill -QUIT "$pid" 2>/dev/null || return 0
  for _ in $(seq 1 150); do kill -0 "$pid" 2>/dev/null || return 0; sleep 0.1; done
  kill -KILL "$pid" 2>/dev/null || true
}}
if pid=$(nginx_running); then stop "$pid"; fi
if pid=$(fpm_running); then stop "$pid"; fi
rm -f {q(nginx_pid_file(host))} {q(fpm_pid_file(host))}
"""


def _pid(pid_file: Path, marker: Path) -> int | None:
    try:
        pid = int(pid_file.read_text().strip())
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except (OSError, ValueError):
        return None
    return pid if str(marker) in cmdline else None


def stack_pids(host: HostState) -> dict[str, int | None]:
    """nginx's and php-fpm's master pids on the host (None when not running)."""
    return {
        "nginx": _pid(nginx_pid_file(host), nginx_conf(host)),
        "php-fpm": _pid(fpm_pid_file(host), fpm_conf(host)),
    }


# --- installation --------------------------------------------------------------------------------------------

INSTALL_PHP = r"""<?php
// Installs WordPress offline (what install.php's second step does) and prints a new application password.
define('WP_INSTALLING', true);
$admin_password = trim(fgets(STDIN));
$want_app_password = trim(fgets(STDIN)) === 'yes';
require '/usr/share/wordpress/wp-load.php';
require_once ABSPATH . 'wp-admin/includes/upgrade.php';
if (!is_blog_installed()) {
    $result = wp_install('Course Review (lab)', getenv('WP_ADMIN'), 'admin@course-review.test', false, '',
                         wp_slash($admin_password));
}
global $wp_rewrite;
$wp_rewrite->set_permalink_structure('/%postname%/');
flush_rewrite_rules(false);
update_option('default_comment_status', 'open');
update_option('comment_moderation', '0');
if ($want_app_password) {
    $user = get_user_by('login', getenv('WP_ADMIN'));
    [$password, $item] = WP_Application_Passwords::create_new_application_password(
        $user->ID, ['name' => 'migrate-lab']);
    echo $password, "\n";
}
"""


def _env_add(state: LabState, values: dict[str, str]) -> None:
    """Add variables to lab.env (mode 0600), keeping what it holds."""
    text = state.env_file.read_text()
    extra = "".join(f"{k}={v}\n" for k, v in values.items())
    _write(state.env_file, text if text.endswith("\n") else text + "\n", 0o600)
    with state.env_file.open("a") as out:
        out.write(extra)


def install(state: LabState, host: HostState) -> bool:
    """WordPress's tables in the host's database, the admin and an application password (in lab.env); only what is
    missing. Returns True when it installed or made a password."""
    values = state.secrets()
    added: dict[str, str] = {}
    if not values.get(ADMIN_PASSWORD_ENV):
        added[ADMIN_PASSWORD_ENV] = secrets.token_urlsafe(18)
    admin_password = values.get(ADMIN_PASSWORD_ENV) or added[ADMIN_PASSWORD_ENV]
    need_app_password = not values.get(APP_PASSWORD_ENV)
    script = state.path / "wordpress-install.php"
    _write(script, INSTALL_PHP)
    env = {
        "PATH": "/usr/bin:/bin",
        "WORDPRESS_CONFIG": config_name(state, host),
        "HTTP_HOST": site_url(state).removeprefix("http://"),
        "WP_ADMIN": ADMIN_USER,
    }
    # The secret goes on stdin: never on a command line or in the environment of another process.
    proc = subprocess.run(
        ["php8.2", "-d", "display_errors=stderr", str(script)],
        input=f"{admin_password}\n{'yes' if need_app_password else 'no'}\n",
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )
    if proc.returncode != 0:
        said = " ".join((proc.stderr or proc.stdout).split())[-300:]
        raise WordPressError(f"installing WordPress on {host.name} failed (exit {proc.returncode}): {said}")
    if need_app_password:
        lines = [line.strip() for line in proc.stdout.splitlines() if line.strip()]
        if not lines:
            raise WordPressError(f"installing WordPress on {host.name}: no application password was made")
        added[APP_PASSWORD_ENV] = lines[-1]
    if added:
        _env_add(state, added)
    return bool(added)


def credentials(state: LabState) -> tuple[str, str]:
    """The REST clients' Basic auth: the admin's login and its application password."""
    return ADMIN_USER, state.secrets()[APP_PASSWORD_ENV]


# --- the lab's plan ------------------------------------------------------------------------------------------


def health_text(state: LabState) -> str:
    tgt = state.target
    return f"""health:
  checks:
    # WordPress answers its REST index (PHP, WordPress and its database together), through the target's nginx.
    - kind: http
      name: wp-json
      url: {_yaml(f"http://{tgt.address}:{tgt.app_port}/wp-json/?_fields=name,namespaces")}
      expect_status: 200
      expect_body: "\\"namespaces\\""
    # php-fpm's own ping, through nginx: the pool runs and takes requests.
    - kind: http
      name: php-fpm ping
      url: {_yaml(f"http://{tgt.address}:{tgt.app_port}{FPM_PING}")}
      expect_status: 200
      expect_body: pong
    # The database holds WordPress's tables (EXISTS stops at the first row).
    - kind: sql
      name: wordpress posts present
      query: "SELECT EXISTS(SELECT 1 FROM {state.db_name}.{TABLE_PREFIX}posts)"
      expect: "1"
  attempts: 20
  interval: 0.5
"""


def _yaml(value: str) -> str:
    import json

    return json.dumps(value)


def plan_text(text: str, state: LabState) -> str:
    """The lab's plan for a WordPress lab: the same plan, with WordPress's health checks and name."""
    start = text.index("health:\n  checks:")
    end = text.index("  interval: 0.5\n", start) + len("  interval: 0.5\n")
    text = text[:start] + health_text(state) + text[end:]
    text = text.replace(
        'description: "course reviews: uploads + MariaDB + DNS, lab source to lab target"',
        'description: "WordPress (nginx + php-fpm): uploads + MariaDB + DNS, lab source to lab target"',
    )
    return text.replace("name: course-review-lab\n", "name: wordpress-lab\n", 1)
