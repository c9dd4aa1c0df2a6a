#!/usr/bin/env bash
# Installs what building and testing distlock needs and a fresh Debian machine may lack:
# the store servers the tests start privately (never the machine's own services) and the
# C libraries some crates link. Idempotent; installing needs root.
set -euo pipefail

# "path-glob package" pairs: a package is installed when nothing matches its glob.
needed=(
  "/usr/bin/redis-server redis-server"
  "/usr/lib/postgresql/*/bin/initdb postgresql"
  "/usr/sbin/mariadbd mariadb-server"
  "/usr/bin/mariadb-install-db mariadb-server"
  "/usr/include/openssl/ssl.h libssl-dev"
  "/usr/bin/pkg-config pkg-config"
  "/usr/bin/openssl openssl"
  "/usr/bin/etcd etcd-server"
  "/usr/bin/etcdctl etcd-client"
  "/usr/share/java/zookeeper-3*.jar zookeeper"
  "/usr/bin/protoc protobuf-compiler"
  "/usr/include/google/protobuf/timestamp.proto libprotobuf-dev"
)

missing=()
for pair in "${needed[@]}"; do
  read -r pattern package <<<"$pair"
  # shellcheck disable=SC2086 # the glob must expand
  if ! compgen -G $pattern >/dev/null && [[ ! " ${missing[*]} " =~ " $package " ]]; then
    missing+=("$package")
  fi
done
if [ ${#missing[@]} -gt 0 ]; then
  if [ "$(id -u)" -ne 0 ]; then
    echo "missing packages: ${missing[*]}; run as root to install them" >&2
    exit 1
  fi
  echo "installing: ${missing[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

# kazoo (PyPI): a ZooKeeper client nobody here wrote, which lock-zk's interoperability
# test contends with.
if ! python3 -c 'import kazoo' 2>/dev/null; then
  echo "installing: kazoo (PyPI)"
  python3 -m pip install -q --disable-pip-version-check --root-user-action=ignore 'kazoo>=2.10,<3'
fi
