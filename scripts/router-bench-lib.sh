# What the router benchmarks that serve several builds at once share (sourced, not run):
# a free loopback port, the echo server's config, and the wait for a server to answer.

# The benchmark's request: a non-streaming chat of nine words.
ROUTER_BENCH_BODY='{"model":"bot","messages":[{"role":"user","content":"the quick brown fox jumps over the lazy dog"}]}'

free_port() {
    python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# echo_config PORT DIR: a `switchyard serve` config on PORT with DIR's echo plugin, answering at
# once (token_delay_ms = 0) from 256 slots.
echo_config() {
    cat <<TOML
[server]
listen = "127.0.0.1:$1"
[[plugins]]
name = "echo"
path = "$2/libswitchyard_plugin_echo.so"
[[models]]
name = "bot"
plugin = "echo"
kind = "echo"
max_in_flight = 1024
settings = { token_delay_ms = 0, slots = 256 }
TOML
}

# wait_until_answering PORT: until the server on PORT answers the benchmark's request (10 s).
wait_until_answering() {
    for _ in $(seq 100); do
        curl -sf -o /dev/null -H 'content-type: application/json' -d "$ROUTER_BENCH_BODY" \
            "http://127.0.0.1:$1/v1/chat/completions" && return 0
        sleep 0.1
    done
    return 1
}
