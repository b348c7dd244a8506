//! Router overhead: a non-streaming echo request through a real `switchyard serve` process over
//! loopback, against a minimal axum server that answers the same request in-process, measured side
//! by side in one run (alternating rounds, since these machines are noisy); and the bare ABI cost
//! of `submit` + its events through the real loader. Writes its section of `docs/benchmarks.md`.
//!
//! Run: `scripts/bench-router.sh` (builds release binaries first).

use axum::{routing::post, Json, Router};
use serde_json::{json, Value};
use std::{
    sync::Arc,
    time::{Duration, Instant},
};
use switchyard::config;
use switchyard_integration_tests::{
    machine_description, plugin_lib, user, write_benchmark_section, Server, TempDir,
};

const CONCURRENCY: usize = 8;
const PHASE: Duration = Duration::from_secs(4);
const ROUNDS: usize = 3;

struct Phase {
    requests: usize,
    latencies: Vec<Duration>,
    elapsed: Duration,
}

impl Phase {
    fn rps(&self) -> f64 {
        self.requests as f64 / self.elapsed.as_secs_f64()
    }
    fn percentile(&self, p: f64) -> Duration {
        let mut sorted = self.latencies.clone();
        sorted.sort();
        sorted[((sorted.len() - 1) as f64 * p).round() as usize]
    }
    fn merge(phases: &[Phase]) -> Phase {
        Phase {
            requests: phases.iter().map(|p| p.requests).sum(),
            latencies: phases
                .iter()
                .flat_map(|p| p.latencies.iter().copied())
                .collect(),
            elapsed: phases.iter().map(|p| p.elapsed).sum(),
        }
    }
}

async fn load(url: String, body: Value) -> Phase {
    let client = reqwest::Client::new();
    let started = Instant::now();
    let mut workers = Vec::new();
    for _ in 0..CONCURRENCY {
        let (client, url, body) = (client.clone(), url.clone(), body.clone());
        workers.push(tokio::spawn(async move {
            let mut latencies = Vec::new();
            while started.elapsed() < PHASE {
                let t = Instant::now();
                let r = client.post(&url).json(&body).send().await.unwrap();
                assert_eq!(r.status(), 200);
                let v: Value = r.json().await.unwrap();
                assert_eq!(v["choices"][0]["message"]["content"], "the quick brown fox");
                latencies.push(t.elapsed());
            }
            latencies
        }));
    }
    let mut latencies = Vec::new();
    for w in workers {
        latencies.extend(w.await.unwrap());
    }
    Phase {
        requests: latencies.len(),
        latencies,
        elapsed: started.elapsed(),
    }
}

/// The baseline: the same response shape, computed in the handler.
async fn baseline_server() -> String {
    async fn answer(Json(req): Json<Value>) -> Json<Value> {
        let text = req["messages"][0]["content"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        let words = text.split_whitespace().count();
        Json(
            json!({"id": "chatcmpl-1", "object": "chat.completion", "created": 0, "model": req["model"],
            "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": words, "completion_tokens": words, "total_tokens": 2 * words}}),
        )
    }
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        axum::serve(
            listener,
            Router::new().route("/v1/chat/completions", post(answer)),
        )
        .await
    });
    format!("http://{addr}/v1/chat/completions")
}

/// submit + events through the real loader, on the caller's thread.
fn abi_cost() -> (Duration, Duration) {
    let dir = TempDir::new("abi-bench");
    let text = format!(
        "[[plugins]]\nname = \"echo\"\npath = \"{}\"\n[[models]]\nname = \"bot\"\nplugin = \"echo\"\nkind = \"echo\"\nsettings = {{ inline = true }}\n",
        plugin_lib("echo").display()
    );
    let cfg = config::from_toml_str(&text, dir.path()).unwrap();
    let runtime = switchyard::runtime::Runtime::new(None, dir.path().join("cache")).unwrap();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(runtime.apply(cfg)).unwrap();
    let generation = runtime.current();
    let instance = generation.table.instances()["bot"].clone();
    let request = switchyard_plugin_api::Request::new(
        1,
        switchyard_plugin_api::Endpoint::Chat,
        vec![switchyard_plugin_api::Message::text(
            switchyard_plugin_api::Role::User,
            "x",
        )],
    );
    let n = 200_000;
    let t = Instant::now();
    for _ in 0..n {
        let (mut admission, mut events) = instance
            .submit(request.clone().into())
            .map_err(|r| format!("{r:?}"))
            .unwrap();
        let mut count = 0;
        while let Ok(event) = events.try_recv() {
            count += 1;
            if matches!(event, switchyard_plugin_api::Event::Finished { .. }) {
                admission.mark_finished();
            }
        }
        assert_eq!(count, 3); // Started, Token, Finished
    }
    let submit = t.elapsed() / n;
    let t = Instant::now();
    for _ in 0..n {
        std::hint::black_box(instance.stats());
    }
    let stats = t.elapsed() / n;
    (submit, stats)
}

fn main() {
    let (submit, stats) = abi_cost();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    let (baseline, routed) = rt.block_on(async {
        let config = format!(
            "[[plugins]]\nname = \"echo\"\npath = \"{}\"\n[[models]]\nname = \"bot\"\nplugin = \"echo\"\nkind = \"echo\"\nmax_in_flight = 1024\nsettings = {{ slots = 64 }}\n",
            plugin_lib("echo").display()
        );
        let server = Arc::new(Server::start(&config).await);
        let baseline_url = baseline_server().await;
        let routed_url = format!("{}/v1/chat/completions", server.base);
        let body = json!({"model": "bot", "messages": user("the quick brown fox")});
        // Warm both.
        let _ = load(baseline_url.clone(), body.clone()).await;
        let _ = load(routed_url.clone(), body.clone()).await;
        let (mut b, mut r) = (Vec::new(), Vec::new());
        for _ in 0..ROUNDS {
            b.push(load(baseline_url.clone(), body.clone()).await);
            r.push(load(routed_url.clone(), body.clone()).await);
        }
        (Phase::merge(&b), Phase::merge(&r))
    });
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    let report = format!(
        "## Router overhead (issue 2)\n\n\
Command: `scripts/bench-router.sh` (release build; `cargo bench -p switchyard-integration-tests --bench router_overhead`).\n\
Machine: {machine}. One run; {ROUNDS} alternating rounds of {phase} s per side, {CONCURRENCY} concurrent\n\
keep-alive clients in the same process as the baseline server, over loopback.\n\n\
| path | requests/s | p50 ms | p99 ms |\n| --- | ---: | ---: | ---: |\n\
| minimal axum server, answer computed in the handler (baseline) | {brps:.0} | {b50:.3} | {b99:.3} |\n\
| `switchyard serve` → echo plugin (real library, thread per request) | {rrps:.0} | {r50:.3} | {r99:.3} |\n\
| ratio switchyard / baseline | {ratio:.2}× throughput | {l50:.2}× | {l99:.2}× |\n\n\
ABI cost through the real loader (echo plugin in `inline` mode, on the caller's thread, {n} calls):\n\
`submit` + 3 events (Started, Token, Finished) through the host's channel sink: **{submit_us:.2} µs**;\n\
`stats()` round trip: **{stats_us:.3} µs**.\n\n\
The switchyard side includes a second process, the route table, admission, the plugin's worker\n\
thread per request and the event channel; the baseline includes none of these. These machines\n\
are shared and noisy (other builds may run beside the benchmark): read the ratios of one run.\n",
        machine = machine_description(),
        phase = PHASE.as_secs(),
        brps = baseline.rps(),
        b50 = ms(baseline.percentile(0.5)),
        b99 = ms(baseline.percentile(0.99)),
        rrps = routed.rps(),
        r50 = ms(routed.percentile(0.5)),
        r99 = ms(routed.percentile(0.99)),
        ratio = routed.rps() / baseline.rps(),
        l50 = routed.percentile(0.5).as_secs_f64() / baseline.percentile(0.5).as_secs_f64(),
        l99 = routed.percentile(0.99).as_secs_f64() / baseline.percentile(0.99).as_secs_f64(),
        n = 200_000,
        submit_us = submit.as_secs_f64() * 1e6,
        stats_us = stats.as_secs_f64() * 1e6,
    );
    print!("{report}");
    write_benchmark_section("router-overhead", &report).unwrap();
}
