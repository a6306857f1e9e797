#!/usr/bin/env bash
# Installs the system packages the lab needs when they are missing: with apt-get as root, else names them.
set -euo pipefail
need=()
have() { command -v "$1" >/dev/null 2>&1 || [ -x "/usr/sbin/$1" ]; }
for pkg in "$@"; do
  case "$pkg" in
    openssh-server) have sshd || need+=("$pkg") ;;
    openssh-client) have ssh || need+=("$pkg") ;;
    rsync) have rsync || need+=("$pkg") ;;
    mariadb-server) have mariadbd || need+=("$pkg") ;;
    mariadb-client) have mariadb || need+=("$pkg") ;;
    mariadb-backup) have mariadb-backup || need+=("$pkg") ;;
    *) dpkg -s "$pkg" >/dev/null 2>&1 || need+=("$pkg") ;;
  esac
done
[ ${#need[@]} -eq 0 ] && exit 0
if [ "$(id -u)" -eq 0 ] && command -v apt-get >/dev/null; then
  echo "installing: ${need[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  # Installing must not start or restart any database or ssh service on this machine: the lab runs its own.
  if [ ! -e /usr/sbin/policy-rc.d ]; then
    printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d && chmod +x /usr/sbin/policy-rc.d
    trap 'rm -f /usr/sbin/policy-rc.d' EXIT
  fi
  apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
else
  echo "missing system packages: ${need[*]}" >&2
  echo "install them with: sudo apt-get install -y ${need[*]}" >&2
  exit 1
fi
