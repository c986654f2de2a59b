#!/bin/sh
# veris sandbox boot (DESIGN §4, §5, §10). Run as root, once, before the
# workload starts:
#   1. a proxy user (uid 14741 by default) and the state dir it owns;
#   2. the CA and trust material (`veris ca init`), and the CA published into
#      the system trust store, so clients that use the system store trust it;
#   3. the nftables redirect (deploy/veris.nft, templated by uid and ports):
#      the workload's TCP 80/443 go to veris, UDP 443 (QUIC) to its silent
#      sink, which records each attempt;
#   4. veris started as the proxy uid (`--redirect-external`: these rules are
#      the boot script's), writing the trust-only env file once it accepts
#      connections. No proxy variables: the redirect is the enforcement, and
#      telling clients about a proxy would hide a broken redirect.
#
# Usage: veris-boot.sh [start | prepare | exec CMD ARGS...]
#   start    steps 1-4, veris in the background, returns once it is ready
#   prepare  steps 1-3 only (systemd runs veris itself, see veris.service)
#   exec     start, then exec CMD with the env file applied (container entrypoint)
#
# Environment (defaults in brackets):
#   VERIS_BIN [/usr/local/bin/veris]   VERIS_STATE_DIR [/veris]
#   VERIS_PROXY_UID [14741]            VERIS_HTTPS_PORT [8443]   VERIS_HTTP_PORT [8081]
#   VERIS_RULES [/etc/veris/veris.nft] VERIS_ENV_FILE [$VERIS_STATE_DIR/env]
#   VERIS_QUIC_PORT [8443, UDP]        VERIS_ALLOW_QUIC [unset: UDP 443 to the sink]  VERIS_SYSTEM_TRUST [1: update the system store]
#   VERIS_SERVE_ARGS [empty: extra `veris serve` flags, e.g. "--twin URL --sandbox ID"]
set -eu

BIN=${VERIS_BIN:-/usr/local/bin/veris}
STATE=${VERIS_STATE_DIR:-/veris}
PROXY_UID=${VERIS_PROXY_UID:-14741}
HTTPS_PORT=${VERIS_HTTPS_PORT:-8443}
HTTP_PORT=${VERIS_HTTP_PORT:-8081}
QUIC_PORT=${VERIS_QUIC_PORT:-8443}
RULES=${VERIS_RULES:-/etc/veris/veris.nft}
ENV_FILE=${VERIS_ENV_FILE:-$STATE/env}
READY=$STATE/ready.json
MODE=${1:-start}

say() { echo "veris-boot: $*" >&2; }
die() { say "$*"; exit 1; }

[ "$(id -u)" = 0 ] || die "must run as root (it installs nftables rules and the system CA). Next: run it as root, or with sudo"
[ "$PROXY_UID" != 0 ] || die "VERIS_PROXY_UID=0 would exempt every root process from the redirect. Next: pick a dedicated uid"
[ -x "$BIN" ] || die "no veris binary at $BIN. Next: set VERIS_BIN"
[ -r "$RULES" ] || die "no ruleset at $RULES. Next: copy deploy/veris.nft there or set VERIS_RULES"
command -v nft >/dev/null || die "nft is not installed. Next: apt-get install nftables"

prepare() {
    # 1. The proxy user and its state dir.
    if ! getent passwd "$PROXY_UID" >/dev/null; then
        useradd --system --uid "$PROXY_UID" --user-group --no-create-home \
            --home-dir "$STATE" --shell /usr/sbin/nologin veris
    fi
    PROXY_GID=$(getent passwd "$PROXY_UID" | cut -d: -f4)
    install -d -m 0755 "$STATE"
    rm -f "$READY"

    # 2. CA and trust material, then hand the state to the proxy uid (the CA
    #    key stays 0600 in a 0700 dir; trust/ stays world-readable).
    "$BIN" ca init --state-dir "$STATE" >/dev/null
    chown -R "$PROXY_UID:$PROXY_GID" "$STATE"
    if [ "${VERIS_SYSTEM_TRUST:-1}" = 1 ]; then
        if command -v update-ca-certificates >/dev/null; then
            install -m 0644 "$STATE/trust/ca.pem" /usr/local/share/ca-certificates/veris.crt
            update-ca-certificates >/dev/null 2>&1
        elif command -v update-ca-trust >/dev/null; then
            install -m 0644 "$STATE/trust/ca.pem" /etc/pki/ca-trust/source/anchors/veris.pem
            update-ca-trust extract
        else
            say "no update-ca-certificates or update-ca-trust: the CA is not in the system store; clients need the env file"
        fi
    fi

    # 3. The redirect, replacing a stale table from an earlier boot.
    if nft list table inet veris >/dev/null 2>&1; then
        nft delete table inet veris
    fi
    sed -e "s/@PROXY_UID@/$PROXY_UID/g" -e "s/@HTTPS_PORT@/$HTTPS_PORT/g" \
        -e "s/@HTTP_PORT@/$HTTP_PORT/g" -e "s/@QUIC_PORT@/$QUIC_PORT/g" "$RULES" |
        if [ -n "${VERIS_ALLOW_QUIC:-}" ]; then grep -v '# quic$'; else cat; fi |
        nft -f -
    say "redirect installed: TCP 443 -> :$HTTPS_PORT, TCP 80 -> :$HTTP_PORT, uid $PROXY_UID exempt"
}

start() {
    rm -f "$READY"
    # 4. veris as the proxy uid; word splitting of VERIS_SERVE_ARGS is wanted.
    # shellcheck disable=SC2086
    setpriv --reuid="$PROXY_UID" --regid="$PROXY_GID" --clear-groups -- \
        "$BIN" serve --transparent --redirect-external --proxy-uid "$PROXY_UID" \
        --https-listen "[::]:$HTTPS_PORT" --http-listen "[::]:$HTTP_PORT" \
        --quic-listen "[::]:$QUIC_PORT" \
        --state-dir "$STATE" --ready-file "$READY" \
        --write-env "$ENV_FILE" --env-trust-only ${VERIS_SERVE_ARGS:-} \
        </dev/null >>"$STATE/veris.log" 2>&1 &
    pid=$!
    # The ready file is written last, after the env file: bounded wait for it.
    i=0
    while [ ! -s "$READY" ]; do
        kill -0 "$pid" 2>/dev/null || die "veris exited during start; see $STATE/veris.log"
        i=$((i + 1))
        [ "$i" -le 300 ] || die "veris not ready after 30 s; see $STATE/veris.log"
        sleep 0.1
    done
    # Trust-only: paths to public material, readable by any workload uid.
    chmod 0644 "$ENV_FILE"
    say "veris ready (pid $pid); env file $ENV_FILE; receipt: $BIN receipt --state-dir $STATE"
}

case "$MODE" in
    prepare) prepare ;;
    start) prepare; start ;;
    exec)
        shift
        [ "$#" -gt 0 ] || die "exec needs a command. Next: veris-boot.sh exec bash"
        prepare
        start
        set -a
        # shellcheck disable=SC1090
        . "$ENV_FILE"
        set +a
        exec "$@"
        ;;
    *) die "unknown mode '$MODE'. Next: veris-boot.sh start | prepare | exec CMD" ;;
esac
