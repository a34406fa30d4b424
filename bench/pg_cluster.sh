# pg_cluster.sh: a throwaway PostgreSQL server for a benchmark, sourced by pg_compare and
# profile. pg_cluster_start DIR ROWS makes a cluster in DIR (initdb, trust on loopback, fsync
# off) with database bench, owned by user bench, holding the table notes of ROWS rows, starts
# it and sets PG_PORT and PG_PID; the caller stops it (kill -INT "$PG_PID").
pg_cluster_start() {
    local dir=$1 rows=$2 pgbin as_pg psql
    pgbin=$(ls -d /usr/lib/postgresql/*/bin | tail -1)
    as_pg="setpriv --reuid=postgres --regid=postgres --init-groups"
    chown postgres: "$dir"
    $as_pg "$pgbin/initdb" -D "$dir/data" -U postgres -E UTF8 --auth=trust >"$dir/initdb.log"
    PG_PORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
    $as_pg "$pgbin/postgres" -D "$dir/data" -p "$PG_PORT" -k "$dir" \
        -c listen_addresses=127.0.0.1 -c fsync=off >"$dir/pg.log" 2>&1 &
    PG_PID=$!
    psql="psql -X -q -h $dir -p $PG_PORT -U postgres"
    for _ in $(seq 100); do $psql -c 'select 1' >/dev/null 2>&1 && break; sleep 0.1; done
    $psql -c "CREATE USER bench" -c "CREATE DATABASE bench OWNER bench"
    $psql -d bench -U bench -c "CREATE TABLE notes (id int PRIMARY KEY, author int, body text)" \
        -c "INSERT INTO notes SELECT i, i % 100, 'note number ' || i FROM generate_series(1, $rows) i"
}
