# lib.sh: what compare, idle and syscalls share: the peers, their configs, starting and stopping them.
#
# Sourced by the scripts next to it, never run. Every server gets one worker (or one
# process; compare may ask for more with set_workers), a free loopback port, the same
# keep-alive limits, and CPU BENCH_SERVER_CPU; load generators belong on BENCH_CLIENT_CPU.
# Everything a run writes lives in one temporary directory that is removed on exit (set
# BENCH_KEEP=1 to keep it).

BENCH_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
SERVER_CPU=${BENCH_SERVER_CPU:-0}
CLIENT_CPU=${BENCH_CLIENT_CPU:-1}
MOONSERVE=${MOONSERVE:-moonserve}
ALL_SERVERS=(moonserve nginx-lua nginx h2o node)   # what the scripts run when not told
# Run only when named: nginx with open_file_cache, a variant that matters for files alone;
# moonserve with its metrics on (--metrics on a listener of their own), to set beside
# moonserve; the access log on (the combined format, to a file in the server's directory):
# moonserve-alog (--access-log FILE), nginx-alog and nginx-lua-alog (access_log FILE
# combined: nginx's default, a write(2) a request), nginx-lua-alogbuf (the same with
# buffer=32k flush=1s, which gathers lines as moonserve does).
KNOWN_SERVERS=("${ALL_SERVERS[@]}" nginx-ofc moonserve-metrics moonserve-alog nginx-alog
    nginx-lua-alog nginx-lua-alogbuf)
WORKERS=1          # workers per server; only compare changes it (set_workers)
SERVER_NCPU=1      # CPUs the server's CPU share is a percentage of
# nginx corks a reply's head and its sendfile body into full segments (tcp_nopush); "off"
# shows what that is worth on large files.
NGINX_NOPUSH=${BENCH_NGINX_NOPUSH:-on}
[[ $NGINX_NOPUSH == on || $NGINX_NOPUSH == off ]] || { echo "error: BENCH_NGINX_NOPUSH must be on or off" >&2; exit 1; }

WORK=""            # the run's temporary directory
NGINX_MODULES=""   # directory holding the ndk and lua modules for nginx-lua
H2O_MRUBY=0        # 1 when h2o was built with mruby (scripted handlers)
STARTED_PIDS=()    # every process this run started and has not yet seen die
USED_PORTS=" "
declare -A SRV_PORT SRV_H2PORT SRV_PID SRV_LAUNCHER
START_WHY=""       # why the last start_server failed

log() { printf '%s\n' "$*" >&2; }
die() {
    log "error: $*"
    exit 1
}

# -- Setup and teardown -------------------------------------------------------

bench_init() {
    WORK=$(mktemp -d "${TMPDIR:-/tmp}/moonserve-bench.XXXXXX")
    # h2o drops root privileges to "nobody", which must still read the files in here.
    chmod 755 "$WORK"
    trap bench_cleanup EXIT
    trap 'exit 130' INT TERM HUP
    # A server or a client holding 10k connections needs a descriptor for each.
    ulimit -n "$(ulimit -Hn)" 2>/dev/null || true
    find_lua_modules || true
    local v
    v=$(h2o --version 2>&1 || true)
    if [[ ${v,,} =~ mruby:\ *yes ]]; then
        H2O_MRUBY=1
    fi
    make_static_files
}

# Stops what this run started, and nothing else: only PIDs recorded at launch.
bench_cleanup() {
    local p
    for p in "${STARTED_PIDS[@]}"; do
        kill -TERM "$p" 2>/dev/null || true
    done
    for _ in $(seq 30); do
        alive_any "${STARTED_PIDS[@]}" || break
        sleep 0.1
    done
    for p in "${STARTED_PIDS[@]}"; do
        kill -KILL "$p" 2>/dev/null || true
    done
    if [ -n "$WORK" ] && [ -z "${BENCH_KEEP:-}" ]; then
        rm -rf "$WORK"
    elif [ -n "$WORK" ]; then
        log "kept $WORK"
    fi
}

alive_any() {
    local p
    for p in "$@"; do
        kill -0 "$p" 2>/dev/null && return 0
    done
    return 1
}

# A PID leaves the list once it is dead, so a later cleanup can never hit a reused PID.
forget_pid() {
    local p keep=()
    for p in "${STARTED_PIDS[@]}"; do
        [ "$p" = "$1" ] || keep+=("$p")
    done
    STARTED_PIDS=("${keep[@]}")
}

# Sends TERM, waits up to 5 s, then KILL.
stop_pid() {
    local pid=$1
    kill -TERM "$pid" 2>/dev/null || true
    for _ in $(seq 50); do
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.1
    done
    kill -KILL "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
    forget_pid "$pid"
}

# -- Workers and CPUs ----------------------------------------------------------

# Prints the CPUs of a taskset list such as "0-2,5", one per line.
cpu_list() {
    tr ',' '\n' <<<"$1" | awk -F- '{ for (c = $1; c <= ($2 == "" ? $1 : $2); c++) print c }'
}

# True if the two CPU lists have a CPU in common.
cpus_shared() {
    [ -n "$(comm -12 <(cpu_list "$1" | sort) <(cpu_list "$2" | sort))" ]
}

# set_workers N: N workers per server. One keeps the rule of one server CPU and one client
# CPU. With more, N workers need N CPUs: the server gets CPUs 0..N-1 (all of them when N is
# at least the number of CPUs) and the client the next one, or, when none is left, the
# server's CPUs, where the two then compete. BENCH_SERVER_CPU and BENCH_CLIENT_CPU still win.
set_workers() {
    WORKERS=$1
    [ "$WORKERS" -gt 1 ] || return 0
    local n last
    n=$(nproc)
    last=$(((WORKERS < n ? WORKERS : n) - 1))
    SERVER_CPU=${BENCH_SERVER_CPU:-0-$last}
    if [ "$WORKERS" -lt "$n" ]; then
        CLIENT_CPU=${BENCH_CLIENT_CPU:-$WORKERS}
    else
        CLIENT_CPU=${BENCH_CLIENT_CPU:-$SERVER_CPU}
    fi
    # N workers can use at most N CPUs, and no more than they are pinned to.
    SERVER_NCPU=$(cpu_list "$SERVER_CPU" | wc -l)
    [ "$SERVER_NCPU" -le "$WORKERS" ] || SERVER_NCPU=$WORKERS
}

# -- Peers ---------------------------------------------------------------------

# Installs what is missing from the peers and tools, if this is root on Debian.
# Extra arguments are "command:package" pairs a script needs besides the common set.
ensure_peers() {
    local want=() pair cmd pkg have=()
    for pair in nginx:nginx h2o:h2o wrk:wrk h2load:nghttp2-client gnuplot:gnuplot-nox \
        node:nodejs "$@"; do
        cmd=${pair%%:*}
        pkg=${pair#*:}
        command -v "$cmd" >/dev/null || want+=("$pkg")
    done
    find_lua_modules || want+=(libnginx-mod-http-lua)
    # nginx-lua's json case encodes with cjson, as an OpenResty site would.
    dpkg -s lua-cjson >/dev/null 2>&1 || want+=(lua-cjson)
    [ ${#want[@]} -eq 0 ] && return 0

    if [ "$(id -u)" -ne 0 ] || ! command -v apt-get >/dev/null; then
        log "missing: ${want[*]} (install with: apt-get install -y ${want[*]}); servers without them are skipped"
        return 0
    fi
    for pkg in "${want[@]}"; do
        if apt-cache show "$pkg" >/dev/null 2>&1; then
            have+=("$pkg")
        else
            log "package $pkg is not in the package lists; going on without it"
        fi
    done
    [ ${#have[@]} -eq 0 ] && return 0
    log "installing: ${have[*]}"
    DEBIAN_FRONTEND=noninteractive apt-get install -y "${have[@]}" >&2 ||
        log "warning: apt-get install failed; servers without their package are skipped"
}

find_lua_modules() {
    local d
    for d in /usr/share/nginx/modules /usr/lib/nginx/modules; do
        if [ -f "$d/ngx_http_lua_module.so" ] && [ -f "$d/ndk_http_module.so" ]; then
            NGINX_MODULES=$d
            return 0
        fi
    done
    return 1
}

# The files every server serves under /static: random bytes, which no server compresses
# (10k.bin, 1m.bin, 2m.bin), and one 10 KiB page twice, as text/10k.html for compression
# on the fly and as pre/10k.html with sidecars made ahead (10k.html.gz, and 10k.html.br
# when the brotli command is there), for servers that send those instead.
make_static_files() {
    local d="$WORK/www/static"
    mkdir -p "$d/text" "$d/pre"
    head -c 10240 /dev/urandom >"$d/10k.bin"
    head -c 1048576 /dev/urandom >"$d/1m.bin"
    head -c 2097152 /dev/urandom >"$d/2m.bin"
    make_page >"$WORK/page.html"   # whole, then cut: head closing a pipe would kill awk
    head -c 10240 "$WORK/page.html" >"$d/text/10k.html"
    cp "$d/text/10k.html" "$d/pre/10k.html"
    gzip -9 -n -c "$d/pre/10k.html" >"$d/pre/10k.html.gz"
    if command -v brotli >/dev/null; then
        brotli -q 11 -c "$d/pre/10k.html" >"$d/pre/10k.html.br"
    else
        log "note: no brotli command; pre/10k.html has a .gz sidecar only"
    fi
    chmod -R a+rX "$WORK/www"
}

# Prints a page of HTML with inline style and script, more than 10 KiB of it, the same on
# every run (a fixed seed). gzip -1 takes 10 KiB of it to about 3 KiB, as it does real pages.
make_page() {
    awk 'BEGIN {
        srand(6)
        nw = split("the a of to and in file server request reply cache header static page " \
            "open send read write body length type date range part bytes client connection " \
            "keep alive worker loop event socket buffer queue route handler table string " \
            "number value", w, " ")
        print "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">"
        print "<title>Static files</title>\n<style>"
        for (i = 0; i < 40; i++)
            printf ".c%d { margin: %dpx %dpx; padding: %dpx; color: #%06x; }\n", i,
                int(rand() * 24), int(rand() * 24), int(rand() * 12), int(rand() * 16777216)
        print "</style>\n<script>"
        for (i = 0; i < 12; i++)
            printf "function f%d(x) { return x * %d + %d; }\n", i, int(rand() * 100), int(rand() * 1000)
        print "</script>\n</head>\n<body>"
        for (p = 0; p < 200; p++) {
            printf "<p class=\"c%d\">", int(rand() * 40)
            n = 6 + int(rand() * 14)
            for (i = 0; i < n; i++)
                printf "%s%s", (i ? " " : ""), w[1 + int(rand() * nw)]
            print "</p>"
        }
        print "</body>\n</html>"
    }'
}

# -- Ports and processes -------------------------------------------------------

port_open() {
    (: <>"/dev/tcp/127.0.0.1/$1") 2>/dev/null
}

# A port below the ephemeral range (so clients' source ports never collide with it),
# unused by any socket, and not handed out before in this run.
free_port() {
    local p
    for _ in $(seq 200); do
        p=$((10000 + RANDOM % 22000))
        case $USED_PORTS in *" $p "*) continue ;; esac
        if [ -z "$(ss -Htan "( sport = :$p )" 2>/dev/null)" ] && ! port_open "$p"; then
            USED_PORTS+="$p "
            echo "$p"
            return 0
        fi
    done
    die "no free port found"
}

# Waits until the port accepts connections, or the process dies, or time runs out.
wait_port() {
    local port=$1 pid=$2 secs=$3
    for _ in $(seq $((secs * 10))); do
        port_open "$port" && return 0
        kill -0 "$pid" 2>/dev/null || return 1
        sleep 0.1
    done
    return 1
}

listen_pid() {
    ss -Hltnp "( sport = :$1 )" 2>/dev/null | grep -o 'pid=[0-9]*' | head -n 1 | cut -d= -f2 || true
}

# True if $1 is $2 or one of its descendants.
is_own_process() {
    local p=$1
    while [ -n "$p" ] && [ "$p" -gt 1 ]; do
        [ "$p" = "$2" ] && return 0
        p=$(awk '/^PPid:/ { print $2 }' "/proc/$p/status" 2>/dev/null || true)
    done
    return 1
}

# tree_stats PID: prints "pid utime stime" (clock ticks: fields 14 and 15 of /proc/PID/stat)
# for PID and each of its descendants, PID first, found through their parent PIDs; nothing
# if PID is gone. A process's line already sums all of its threads. Every stat file is read
# in one go, since a process may exit meanwhile; the name field may hold spaces, so the
# fields are counted after its ")".
tree_stats() {
    { cat /proc/[0-9]*/stat 2>/dev/null || true; } | awk -v root="$1" '
        { pid = $1; sub(/.*\) /, ""); kids[$2] = kids[$2] " " pid; ticks[pid] = $12 " " $13 }
        END {
            todo = (root in ticks) ? root : ""
            while (todo != "") {
                n = split(todo, q, " "); todo = ""
                for (i = 1; i <= n; i++) { print q[i], ticks[q[i]]; todo = todo kids[q[i]] }
            }
        }'
}

# Prints PID and all its descendants, one per line, PID first.
process_tree() {
    tree_stats "$1" | cut -d' ' -f1
}

# Prints "utime stime" in clock ticks for the whole server: PID and its descendants (a
# master and its workers), each with all its threads. Fails if PID is gone.
cpu_ticks() {
    tree_stats "$1" | awk '{ u += $2; s += $3 } END { if (NR == 0) exit 1; print u, s }'
}

# cpu_stat CPULIST: prints "busy idle steal" in clock ticks, summed over the CPUs of a
# taskset list, from /proc/stat: busy is user, nice, system, irq and softirq, whatever ran
# (the server, other processes, the kernel's softirq threads); idle includes iowait.
cpu_stat() {
    local want
    want=$(cpu_list "$1" | sed 's/^/cpu/' | tr '\n' ' ')
    awk -v want=" $want" 'index(want, " " $1 " ") {
        busy += $2 + $3 + $4 + $7 + $8; idle += $5 + $6; steal += $9 }
        END { print busy + 0, idle + 0, steal + 0 }' /proc/stat
}

# -- Server configs ------------------------------------------------------------

# The limits every config shares: idle keep-alive connections stay open for 300 s and a
# connection may carry any number of requests, so no server pays for reconnects that
# another one is spared.

write_nginx_conf() {
    local name=$1 dir=$2 port=$3 h2port=$4 hello json="" alog=off
    local nofile
    nofile=$(ulimit -Hn)
    [ "$nofile" = unlimited ] && nofile=65536
    case $name in
    *-alog) alog="$dir/access.log combined" ;;
    *-alogbuf) alog="$dir/access.log combined buffer=32k flush=1s" ;;
    esac
    name=${name%-alog*} # (the variant's base: nginx or nginx-lua)
    if [ "$name" = nginx-lua ]; then
        # The explicit length keeps the reply identical to the other servers' (ngx.print
        # alone would answer chunked).
        hello='default_type text/plain;
            content_by_lua_block { ngx.header.content_length = 11; ngx.print("hello world") }'
        json='location = /json {
            default_type application/json;
            content_by_lua_block {
                local cjson = require "cjson"
                local body = cjson.encode({ message = "hello world", n = 42 })
                ngx.header.content_length = #body
                ngx.print(body)
            }
        }'
    else
        hello='default_type text/plain;
            return 200 "hello world";'
    fi
    # nginx-ofc keeps files open, with their sizes and times, for up to 60 s instead of
    # opening and closing them on each request (the .gz beside a file too, for gzip_static).
    local ofc=""
    if [ "$name" = nginx-ofc ]; then
        ofc='open_file_cache max=1000 inactive=60s;
    open_file_cache_valid 60s;'
    fi
    mkdir -p "$dir/tmp"
    {
        if [ "$name" = nginx-lua ]; then
            echo "load_module $NGINX_MODULES/ndk_http_module.so;"
            echo "load_module $NGINX_MODULES/ngx_http_lua_module.so;"
        fi
        # One worker runs alone, with no master; more run under a master, as in production.
        local master=off
        [ "$WORKERS" -gt 1 ] && master=on
        cat <<EOF
worker_processes $WORKERS;
daemon off;
master_process $master;
pid $dir/nginx.pid;
error_log $dir/error.log warn;
worker_rlimit_nofile $nofile;
events {
    worker_connections 20000;
}
http {
    access_log $alog;
    default_type application/octet-stream;
    sendfile on;
    tcp_nopush $NGINX_NOPUSH;
    keepalive_timeout 300s;
    keepalive_requests 1000000;
    $ofc
    client_body_temp_path $dir/tmp/body;
    proxy_temp_path $dir/tmp/proxy;
    fastcgi_temp_path $dir/tmp/fastcgi;
    uwsgi_temp_path $dir/tmp/uwsgi;
    scgi_temp_path $dir/tmp/scgi;
EOF
        # nginx 1.22 speaks prior-knowledge h2c only on a listener marked http2, and then
        # no HTTP/1.1 there, so HTTP/2 gets its own port with the same locations.
        local listen
        for listen in "$port" "$h2port http2"; do
            cat <<EOF
    server {
        listen 127.0.0.1:$listen;
        location = / {
            $hello
        }
        $json
        location /static/ {
            root $WORK/www;
        }
        # Compressed per request (text/html is always among gzip_types); Debian's nginx
        # has no brotli module, so these answer gzip to "br, gzip".
        location /static/text/ {
            root $WORK/www;
            gzip on;
            gzip_comp_level 1;
            gzip_vary on;
        }
        location /static/pre/ {
            root $WORK/www;
            gzip_static on;
            gzip_vary on;
        }
    }
EOF
        done
        echo "}"
    } >"$dir/nginx.conf"
}

write_h2o_conf() {
    local dir=$1 port=$2
    {
        cat <<EOF
listen:
  host: 127.0.0.1
  port: $port
num-threads: $WORKERS
max-connections: 20000
http1-request-timeout: 300
http2-idle-timeout: 300
error-log: $dir/error.log
hosts:
  default:
    paths:
      /static/text:
        file.dir: $WORK/www/static/text
        compress: ON
      /static/pre:
        file.dir: $WORK/www/static/pre
        file.send-compressed: ON
      /static:
        file.dir: $WORK/www/static
EOF
        # Without mruby h2o has no scripted handler here: the hello and json cases are n/a.
        if [ "$H2O_MRUBY" = 1 ]; then
            cat <<'EOF'
      /json:
        mruby.handler: |
          Proc.new do |env|
            body = JSON.generate({"message" => "hello world", "n" => 42})
            [200, {"content-type" => "application/json", "content-length" => body.bytesize.to_s}, [body]]
          end
      /:
        mruby.handler: |
          Proc.new do |env|
            [200, {"content-type" => "text/plain", "content-length" => "11"}, ["hello world"]]
          end
EOF
        fi
    } >"$dir/h2o.conf"
}

write_node_app() {
    cat >"$1/hello.js" <<'EOF'
// hello.js: the node peer, one process with the stock http module.
const http = require('http');
const port = Number(process.argv[2]);
const hello = Buffer.from('hello world');
const server = http.createServer((req, res) => {
    if (req.url === '/') {
        res.writeHead(200, { 'content-type': 'text/plain', 'content-length': hello.length });
        res.end(hello);
    } else if (req.url === '/json') {
        const body = JSON.stringify({ message: 'hello world', n: 42 });
        res.writeHead(200, {
            'content-type': 'application/json',
            'content-length': Buffer.byteLength(body),
        });
        res.end(body);
    } else {
        res.writeHead(404, { 'content-length': 0 });
        res.end();
    }
});
server.keepAliveTimeout = 300000; // the same idle limit as the other servers
server.listen(port, '127.0.0.1');
EOF
}

# -- Starting and stopping -----------------------------------------------------

# Logs why a server is skipped and keeps the reason for the caller's report.
skip() {
    START_WHY=$2
    log "skip $1: $2"
}

# start_server NAME: starts NAME pinned to SERVER_CPU and waits for its port.
# Sets SRV_PORT, SRV_H2PORT (empty when it has no HTTP/2 listener) and SRV_PID (the
# process whose CPU, with its descendants', and memory get measured: the one holding the
# listening socket, or with several workers the master the launcher started). On failure
# prints one line saying why, sets START_WHY and returns 1; the caller goes on without it.
start_server() {
    local name=$1 dir="$WORK/$1" port h2port="" cmd=() limits=()
    mkdir -p "$dir"
    chmod 755 "$dir"
    port=$(free_port)
    case $name in
    nginx | nginx-lua | nginx-ofc | nginx-alog | nginx-lua-alog | nginx-lua-alogbuf)
        if ! command -v nginx >/dev/null; then
            skip "$name" "nginx is not installed"
            return 1
        fi
        if [ "${name%-alog*}" = nginx-lua ] && [ -z "$NGINX_MODULES" ]; then
            skip "$name" "the ndk and lua modules (libnginx-mod-http-lua) are not installed"
            return 1
        fi
        h2port=$(free_port)
        write_nginx_conf "$name" "$dir" "$port" "$h2port"
        cmd=(nginx -p "$dir/" -c "$dir/nginx.conf" -e "$dir/error.log")
        ;;
    h2o)
        if ! command -v h2o >/dev/null; then
            skip "$name" "it is not installed"
            return 1
        fi
        write_h2o_conf "$dir" "$port"
        h2port=$port # h2o takes prior-knowledge h2c on its HTTP/1.1 port
        cmd=(h2o -c "$dir/h2o.conf")
        ;;
    node)
        if [ "$WORKERS" -gt 1 ]; then
            skip "$name" "one process only, it has no $WORKERS-worker mode"
            return 1
        fi
        if ! command -v node >/dev/null; then
            skip "$name" "it is not installed"
            return 1
        fi
        write_node_app "$dir"
        cmd=(node "$dir/hello.js" "$port")
        ;;
    moonserve | moonserve-metrics | moonserve-alog)
        read -r -a cmd <<<"$MOONSERVE"
        if [ ${#cmd[@]} -eq 0 ] || ! command -v "${cmd[0]}" >/dev/null; then
            skip "$name" "command '$MOONSERVE' not found (set MOONSERVE to run it)"
            return 1
        fi
        # --workers 0 is one process with no master; N > 1 a master and N worker processes.
        local w=0
        [ "$WORKERS" -gt 1 ] && w=$WORKERS
        cmd+=("$BENCH_DIR/apps/hello.lua" --listen "127.0.0.1:$port" --workers "$w")
        [ "$name" = moonserve-metrics ] && cmd+=(--metrics "127.0.0.1:$(free_port)")
        [ "$name" = moonserve-alog ] && cmd+=(--access-log "$dir/access.log")
        # The peers' keep-alive rules: 300 s idle, and no cap that matters on requests per
        # connection (moonserve's default closes a connection after 1000).
        # The defaults cap connections from one address at 256 (the peers have no such cap;
        # a 256-connection case would sit at it), and well below 10k for idle.
        limits=(--limit idle_timeout=300 --limit requests_per_connection=1000000
            --limit connections=20000 --limit per_source=20000)
        h2port=$port # tried; a case check decides whether it answers HTTP/2
        ;;
    *)
        die "unknown server '$name' (known: ${KNOWN_SERVERS[*]})"
        ;;
    esac

    local launcher
    if ! launch "$dir" "$port" "${cmd[@]}" "${limits[@]}"; then
        if [ ${#limits[@]} -gt 4 ]; then
            # A build that does not know every limit key yet refuses to start with them;
            # without them its per-address cap may refuse connections, which the idle
            # report shows as fewer connections still open.
            log "moonserve refused the connection limits; retrying with the keep-alive limits alone"
            launch "$dir" "$port" "${cmd[@]}" "${limits[@]:0:4}" || launcher=""
        else
            launcher=""
        fi
        if [ -z "$launcher" ]; then
            skip "$name" "it did not start on 127.0.0.1:$port"
            local f
            for f in "$dir/out.log" "$dir/error.log"; do
                [ -s "$f" ] && tail -n 5 "$f" | sed 's/^/    /' >&2
            done
            return 1
        fi
    fi
    # The launcher may be a wrapper; measure the process that holds the socket, as long
    # as it is one this run started. With several workers the master and every worker hold
    # it, and any of them may be listed first: measure from the launcher, whose descendants
    # are the master and its workers (taskset and moonserve's script exec, so for nginx
    # and moonserve it is the master itself).
    local pid=""
    [ "$WORKERS" -gt 1 ] || pid=$(listen_pid "$port")
    if [ -z "$pid" ] || ! is_own_process "$pid" "$launcher"; then
        pid=$launcher
    fi
    [ "$pid" = "$launcher" ] || STARTED_PIDS+=("$pid")
    SRV_PORT[$name]=$port
    SRV_H2PORT[$name]=$h2port
    SRV_PID[$name]=$pid
    SRV_LAUNCHER[$name]=$launcher
    return 0
}

# launch DIR PORT COMMAND...: runs the command pinned to SERVER_CPU and waits for the port.
# Sets launcher (the caller's local) to its PID; on failure stops it and returns 1.
launch() {
    local dir=$1 port=$2
    shift 2
    BENCH_STATIC_DIR="$WORK/www/static" taskset -c "$SERVER_CPU" "$@" \
        >"$dir/out.log" 2>&1 </dev/null &
    launcher=$!
    STARTED_PIDS+=("$launcher")
    wait_port "$port" "$launcher" 15 && return 0
    stop_pid "$launcher"
    return 1
}

stop_server() {
    local name=$1 pid=${SRV_PID[$1]:-} launcher=${SRV_LAUNCHER[$1]:-} p rest=()
    # A master stops its workers; any that outlive it are stopped by their PIDs, taken
    # from its tree before it goes.
    [ -n "$pid" ] && read -r -a rest <<<"$(process_tree "$pid" 2>/dev/null | tail -n +2 | tr '\n' ' ')"
    [ -n "$pid" ] && stop_pid "$pid"
    [ -n "$launcher" ] && [ "$launcher" != "$pid" ] && stop_pid "$launcher"
    for p in "${rest[@]}"; do
        if kill -0 "$p" 2>/dev/null; then stop_pid "$p"; fi
    done
    unset "SRV_PID[$name]" "SRV_LAUNCHER[$name]"
    return 0
}

server_alive() {
    [ -n "${SRV_PID[$1]:-}" ] && kill -0 "${SRV_PID[$1]}" 2>/dev/null
}

# -- Cases -----------------------------------------------------------------------

# A case is a path, the wrk arguments that go with it and a check of the answer; compare
# loads them and syscalls counts them. The files are those of make_static_files.
ACCEPT_ENCODING="br, gzip"   # static10k-enc and static10k-pre
# static2m-parts: the 2 MiB file in 8 Range requests of 256 KiB, in turn on each connection
# (bench/ranges.lua reads these two).
export RANGE_PIECE=262144 RANGE_PIECES=8

declare -A COND_ARGS   # server -> the If-None-Match / If-Modified-Since pair for the 304 case
declare -A CASE_NOTE   # "server case" -> what the check saw that a report should show
CHECK_WHY=""
CASE_ARGS=()

case_path() {
    case $1 in
    static10k | 304) echo /static/10k.bin ;;
    static10k-enc) echo /static/text/10k.html ;;
    static10k-pre) echo /static/pre/10k.html ;;
    static1m) echo /static/1m.bin ;;
    static2m-parts) echo /static/2m.bin ;;
    json) echo /json ;;
    *) echo / ;;
    esac
}

# case_args SERVER CASE: sets CASE_ARGS to the case's wrk arguments (for 304, the validators
# check_case found on that server).
case_args() {
    CASE_ARGS=()
    case $2 in
    pipeline16) CASE_ARGS=(-s "$BENCH_DIR/pipeline.lua") ;;
    churn) CASE_ARGS=(-H "Connection: close") ;;
    304) eval "CASE_ARGS=(${COND_ARGS[$1]})" ;;
    static10k-enc | static10k-pre) CASE_ARGS=(-H "Accept-Encoding: $ACCEPT_ENCODING") ;;
    static2m-parts) CASE_ARGS=(-s "$BENCH_DIR/ranges.lua") ;;
    esac
}

# Prints the value of field NAME (lowercase) in a head that curl -D wrote, lowercased.
head_field() {
    tr -d '\r' <"$2" | awk -v n="$1:" 'tolower($1) == n { sub(/^[^:]*: */, ""); print tolower($0); exit }'
}

# check_case SERVER CASE: makes sure the server gives the expected answer before it is
# loaded, so that a fast stream of errors is never reported as a result. On failure sets
# CHECK_WHY and returns 1. Runs in the caller's shell, not a subshell: it keeps the 304
# case's validators (COND_ARGS) and the coding a server sends (CASE_NOTE).
check_case() {
    local s=$1 c=$2 url code body hdrs etag lm path
    path=$(case_path "$c")
    url="http://127.0.0.1:${SRV_PORT[$s]}$path"
    case $c in
    hello | hello256 | pipeline16 | churn | json)
        body=$(curl -s --max-time 5 -w '\n%{http_code}' "$url" || true)
        code=${body##*$'\n'}
        body=${body%$'\n'*}
        [ "$code" = 200 ] || { CHECK_WHY="GET $path answered '$code'"; return 1; }
        if [ "$c" = json ]; then
            [[ $body == *'"hello world"'* && $body == *42* ]] || { CHECK_WHY="unexpected JSON body"; return 1; }
        else
            [ "$body" = "hello world" ] || { CHECK_WHY="unexpected body"; return 1; }
        fi
        ;;
    static10k | static1m)
        code=$(curl -s --max-time 5 -o "$WORK/check.body" -w '%{http_code}' "$url" || true)
        [ "$code" = 200 ] || { CHECK_WHY="GET $path answered '$code'"; return 1; }
        cmp -s "$WORK/check.body" "$WORK/www$path" || { CHECK_WHY="GET $path: not the file's bytes"; return 1; }
        ;;
    static10k-enc | static10k-pre)
        # The coding the server picks, as sent; then the body decoded must be the file.
        code=$(curl -s --max-time 5 -H "Accept-Encoding: $ACCEPT_ENCODING" -D "$WORK/check.head" \
            -o "$WORK/check.body" -w '%{http_code}' "$url" || true)
        [ "$code" = 200 ] || { CHECK_WHY="GET $path answered '$code'"; return 1; }
        local enc size
        enc=$(head_field content-encoding "$WORK/check.head")
        size=$(wc -c <"$WORK/check.body")
        case $enc in
        br | gzip) ;;
        *) CHECK_WHY="no br or gzip for '$ACCEPT_ENCODING' (content-encoding '${enc:-none}')"; return 1 ;;
        esac
        curl -s --max-time 5 --compressed -H "Accept-Encoding: $ACCEPT_ENCODING" -o "$WORK/check.body" "$url" || true
        cmp -s "$WORK/check.body" "$WORK/www$path" || { CHECK_WHY="the $enc body does not decode to the file"; return 1; }
        CASE_NOTE["$s $c"]="sends $enc, $size bytes"
        ;;
    static2m-parts)
        local i first last want
        for i in $(seq 0 $((RANGE_PIECES - 1))); do
            first=$((i * RANGE_PIECE))
            last=$((first + RANGE_PIECE - 1))
            code=$(curl -s --max-time 5 -H "Range: bytes=$first-$last" -D "$WORK/check.head" \
                -o "$WORK/check.body" -w '%{http_code}' "$url" || true)
            [ "$code" = 206 ] || { CHECK_WHY="Range bytes=$first-$last answered '$code'"; return 1; }
            want="bytes $first-$last/$(wc -c <"$WORK/www$path")"
            [ "$(head_field content-range "$WORK/check.head")" = "$want" ] ||
                { CHECK_WHY="Range bytes=$first-$last: content-range is not '$want'"; return 1; }
            dd if="$WORK/www$path" of="$WORK/check.want" bs="$RANGE_PIECE" skip="$i" count=1 status=none
            cmp -s "$WORK/check.body" "$WORK/check.want" ||
                { CHECK_WHY="Range bytes=$first-$last: not the file's bytes"; return 1; }
        done
        ;;
    304)
        hdrs=$(curl -s --max-time 5 -D - -o /dev/null "$url" | tr -d '\r' || true)
        etag=$(awk 'tolower($1) == "etag:" { sub(/^[^:]*: */, ""); print }' <<<"$hdrs")
        lm=$(awk 'tolower($1) == "last-modified:" { sub(/^[^:]*: */, ""); print }' <<<"$hdrs")
        local args=()
        [ -n "$etag" ] && args+=(-H "If-None-Match: $etag")
        [ -n "$lm" ] && args+=(-H "If-Modified-Since: $lm")
        [ ${#args[@]} -gt 0 ] || { CHECK_WHY="no ETag or Last-Modified"; return 1; }
        code=$(curl -s --max-time 5 -o /dev/null -w '%{http_code}' "${args[@]}" "$url" || true)
        [ "$code" = 304 ] || { CHECK_WHY="conditional GET answered '$code'"; return 1; }
        COND_ARGS[$s]=$(printf '%q ' "${args[@]}")
        ;;
    h2hello | h2hello256)
        [ -n "${SRV_H2PORT[$s]}" ] || { CHECK_WHY="no HTTP/2 listener"; return 1; }
        body=$(timeout 10 h2load -n 8 -c 1 -t 1 "http://127.0.0.1:${SRV_H2PORT[$s]}/" 2>&1 || true)
        [[ $body == *"8 succeeded"* && $body == *"8 2xx"* ]] || { CHECK_WHY="no prior-knowledge h2c answer"; return 1; }
        ;;
    *)
        CHECK_WHY="unknown case '$c'"
        return 1
        ;;
    esac
}

# -- Load ------------------------------------------------------------------------

# wrk_run SECONDS CONNS OUT URL [wrk args...]: one bounded wrk run on CLIENT_CPU.
wrk_run() {
    local secs=$1 conns=$2 out=$3 url=$4
    shift 4
    timeout -k 5 $((secs + 30)) taskset -c "$CLIENT_CPU" \
        wrk -t 1 -c "$conns" -d "${secs}s" --timeout 5s --latency "$@" "$url" >"$out" 2>&1
}

# Prints "requests seconds p50_us p99_us errors" from a wrk report. A percentile wrk prints as
# 0 (it does so now and then for the 99th when requests are pipelined) becomes "-": unknown.
wrk_parse() {
    awk '
    function us(v) {
        if (v ~ /us$/) return v + 0
        if (v ~ /ms$/) return v * 1000
        if (v ~ /m$/)  return v * 60e6
        if (v ~ /s$/)  return v * 1e6
        return v + 0
    }
    / requests in / {
        req = $1; d = $4; sub(/,$/, "", d)
        secs = (d ~ /ms$/) ? d / 1000 : (d ~ /m$/) ? d * 60 : d + 0
    }
    $1 == "50%" { p50 = us($2) }
    $1 == "99%" { p99 = us($2) }
    /Socket errors:/ { gsub(/[^0-9 ]/, " "); for (i = 1; i <= NF; i++) err += $i }
    /Non-2xx or 3xx responses:/ { err += $NF }
    function known(v) { return v > 0 ? sprintf("%.0f", v) : "-" }
    END { if (req == "") exit 1; printf "%d %s %s %s %d\n", req, secs, known(p50), known(p99), err }
    ' "$1"
}
