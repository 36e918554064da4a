# servers.sh — shell helpers shared by the benchmark scripts: start a cache server on a free
# loopback port and wait for it, stop it, read the bench's JSON. Sourced, not run. The caller
# defines die(), WORK (a scratch directory), SERVER_MEM and SERVER_THREADS, and may set
# SERVER_EXTRA_FLAGS (an array) for flags both servers take.
[ -n "${SERVER_EXTRA_FLAGS+x}" ] || SERVER_EXTRA_FLAGS=()

stop_server() {
    [ -n "$SERVER_PID" ] || return 0
    kill -TERM "$SERVER_PID" 2>/dev/null || true
    for _ in $(seq 50); do kill -0 "$SERVER_PID" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$SERVER_PID" 2>/dev/null || true
    wait "$SERVER_PID" 2>/dev/null || true
    SERVER_PID=""
}

# A random port in 20000-59999 that nothing listens on; the caller still copes with losing a race.
pick_port() {
    local p
    for _ in $(seq 50); do
        p=$((20000 + RANDOM % 40000))
        if [ -z "$(ss -Htln "sport = :$p" 2>/dev/null)" ]; then echo "$p"; return 0; fi
    done
    die "no free port found in 20000-59999"
}

# start_server NAME BIN: sets SERVER_PID, PORT and SERVER_CMD, or dies with the server's log.
start_server() {
    local name=$1 bin=$2 log
    local user_flag=()
    [ "$(id -u)" = 0 ] && user_flag=(-u root) # memcached refuses to run as root without -u
    for _ in 1 2 3; do
        PORT=$(pick_port)
        log="$WORK/$name.server.log"
        SERVER_CMD=("$bin" -p "$PORT" -l 127.0.0.1 -U 0 -m "$SERVER_MEM" -t "$SERVER_THREADS" "${SERVER_EXTRA_FLAGS[@]}" "${user_flag[@]}")
        "${SERVER_CMD[@]}" >"$log" 2>&1 &
        SERVER_PID=$!
        for _ in $(seq 100); do
            if ! kill -0 "$SERVER_PID" 2>/dev/null; then break; fi
            if (exec 3<>"/dev/tcp/127.0.0.1/$PORT") 2>/dev/null; then return 0; fi
            sleep 0.1
        done
        if kill -0 "$SERVER_PID" 2>/dev/null; then
            stop_server
            die "$name ($bin) did not accept connections on 127.0.0.1:$PORT within 10 s; log: $(tail -5 "$log")"
        fi
        wait "$SERVER_PID" 2>/dev/null || true
        SERVER_PID=""
        grep -qi "address already in use" "$log" || die "$name ($bin) exited at startup: $(tail -5 "$log")"
    done
    die "$name: three ports in a row were taken; try again"
}

json_field() { # json_field FILE NAME: a numeric field of the bench's JSON line
    grep '^{' "$1" | tail -1 | grep -o "\"$2\":[-0-9.e+]*" | head -1 | cut -d: -f2
}
