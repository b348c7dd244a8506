//! The inference gateway's model-server protocol on `/metrics` (issue 17): vLLM's names, types,
//! labels and values, scraped under load from a real `switchyard serve` and read by the reference
//! Python client's parsers (OpenMetrics, the format served, and the text format, as endpoint
//! pickers read it). Instances: echo with a token delay and adapters, echo exported through the
//! frozen API 2.0 surface (the documented fallbacks), and Phi4MM on the tiny fixture.
//!
//! Polling for a state reads one line with a string search (cheap enough to poll); every
//! assertion on a scrape goes through the real parsers.

use serde_json::{json, Value};
use std::{
    io::Write,
    process::{Command, Stdio},
    time::{Duration, Instant},
};
use switchyard_fixtures::fixture;
use switchyard_integration_tests::{phi4mm_lib, plugin_lib, python_with, user, Server};

const PARSER: &str = "prometheus-client==0.26.0";

/// Echo `slow` (2 slots, 16 KV positions each, adapters `alpha` and `beta`) behind the names
/// `chat` and `assistant`; echo 2.0 `old` behind `legacy`.
fn echo_config() -> String {
    format!(
        r#"
[[plugins]]
name = "echo"
path = "{echo}"
[[plugins]]
name = "echo-2-0"
path = "{echo_2_0}"
[[models]]
name = "slow"
plugin = "echo"
kind = "echo"
settings = {{ token_delay_ms = 150, slots = 2, queue = 8, kv_tokens_per_slot = 16, adapters = ["alpha", "beta"] }}
[[models]]
name = "old"
plugin = "echo-2-0"
kind = "echo"
settings = {{ token_delay_ms = 150, slots = 2 }}
[[routes]]
models = ["chat", "assistant"]
backends = [{{ model = "slow" }}]
[[routes]]
models = ["legacy"]
backends = [{{ model = "old" }}]
"#,
        echo = plugin_lib("echo").display(),
        echo_2_0 = plugin_lib("echo_2_0").display(),
    )
}

/// Phi4MM `phi` (the tiny fixture, 2 slots) behind `phi4mm`.
fn phi4mm_config() -> String {
    format!(
        r#"
[[plugins]]
name = "phi4mm"
path = "{phi}"
[[models]]
name = "phi"
plugin = "phi4mm"
kind = "phi4mm"
settings = {{ checkpoint = "{ckpt}", slots = 2 }}
[[routes]]
models = ["phi4mm"]
backends = [{{ model = "phi" }}]
"#,
        phi = phi4mm_lib().display(),
        ckpt = fixture().join("model").display(),
    )
}

/// The `model_name` and `instance` labels of each instance's `vllm:*` series.
const SLOW: (&str, &str) = ("chat,assistant", "slow");
const OLD: (&str, &str) = ("legacy", "old");
const PHI: (&str, &str) = ("phi4mm", "phi");

/// What both parsers made of one exposition.
struct Scrape {
    openmetrics: Value,
    text: Value,
    raw: String,
}

/// Parses every exposition with the reference parsers, in one Python run.
fn parse(texts: &[String]) -> Vec<Scrape> {
    let python = python_with(PARSER);
    let script =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("integration/parse_metrics.py");
    let mut child = Command::new(python)
        .arg(script)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(serde_json::to_string(texts).unwrap().as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{}\n{}",
        String::from_utf8_lossy(&out.stderr),
        texts.join("\n----\n")
    );
    let parsed: Vec<Value> = serde_json::from_slice(&out.stdout).unwrap();
    parsed
        .into_iter()
        .zip(texts)
        .map(|(p, raw)| Scrape {
            openmetrics: p["openmetrics"].clone(),
            text: p["text"].clone(),
            raw: raw.clone(),
        })
        .collect()
}

fn labelled<'a>(family: &'a Value, sample: &str, of: (&str, &str)) -> Vec<&'a Value> {
    family["samples"]
        .as_array()
        .map(|s| s.as_slice())
        .unwrap_or_default()
        .iter()
        .filter(|s| s[0] == sample && s[1]["model_name"] == of.0 && s[1]["instance"] == of.1)
        .collect()
}

impl Scrape {
    fn family(&self, name: &str, kind: &str) -> &Value {
        let family = &self.openmetrics[name];
        assert_eq!(family["type"], kind, "{name} in:\n{}", self.raw);
        family
    }

    /// The one sample of gauge `name` for `of`, the same under both parsers.
    fn gauge(&self, name: &str, of: (&str, &str)) -> f64 {
        let samples = labelled(self.family(name, "gauge"), name, of);
        assert_eq!(samples.len(), 1, "{name} {of:?} in:\n{}", self.raw);
        let value = samples[0][2].as_f64().unwrap();
        let text = &self.text[name];
        assert_eq!(text["type"], "gauge", "{name} (text format):\n{}", self.raw);
        let seen = labelled(text, name, of);
        assert_eq!(seen.len(), 1, "{name} {of:?} (text format):\n{}", self.raw);
        assert_eq!(seen[0][2].as_f64(), Some(value), "{name} {of:?}");
        value
    }

    /// The labels of `vllm:lora_requests_info` for `of`, with its value; `None` without one.
    fn lora(&self, of: (&str, &str)) -> Option<(Value, f64)> {
        let name = "vllm:lora_requests_info";
        let samples = labelled(self.family(name, "gauge"), name, of);
        assert!(samples.len() <= 1, "{}", self.raw);
        samples
            .first()
            .map(|s| (s[1].clone(), s[2].as_f64().unwrap()))
    }

    fn counter(&self, name: &str, of: (&str, &str)) -> f64 {
        let samples = labelled(self.family(name, "counter"), &format!("{name}_total"), of);
        assert_eq!(samples.len(), 1, "{name} {of:?} in:\n{}", self.raw);
        samples[0][2].as_f64().unwrap()
    }

    /// `(le, cumulative count)` of histogram `name` for `of`, checked: the buckets are `expected`
    /// then `+Inf`, cumulative, and `+Inf` equals `_count`.
    fn histogram(&self, name: &str, of: (&str, &str), expected: &[f64]) -> Vec<(f64, f64)> {
        let family = self.family(name, "histogram");
        let buckets: Vec<(f64, f64)> = labelled(family, &format!("{name}_bucket"), of)
            .iter()
            .map(|s| {
                let le = s[1]["le"].as_str().unwrap();
                let le = if le == "+Inf" {
                    f64::INFINITY
                } else {
                    le.parse().unwrap()
                };
                (le, s[2].as_f64().unwrap())
            })
            .collect();
        let les: Vec<f64> = buckets.iter().map(|b| b.0).collect();
        let mut want = expected.to_vec();
        want.push(f64::INFINITY);
        assert_eq!(les, want, "{name} buckets:\n{}", self.raw);
        assert!(
            buckets.windows(2).all(|w| w[0].1 <= w[1].1),
            "{name} not cumulative"
        );
        let count = labelled(family, &format!("{name}_count"), of);
        assert_eq!(count.len(), 1);
        assert_eq!(count[0][2].as_f64(), Some(buckets.last().unwrap().1));
        buckets
    }
}

/// The value on the line of `name` for `of`, by string search: only for polling.
fn peek(text: &str, name: &str, of: (&str, &str)) -> Option<f64> {
    let head = format!("{name}{{model_name=\"{}\",instance=\"{}\"}} ", of.0, of.1);
    text.lines()
        .find_map(|l| l.strip_prefix(&head))
        .and_then(|v| v.trim().parse().ok())
}

/// Scrapes until `ready` holds (or panics after 60 s), returning that exposition.
async fn scrape_until(server: &Server, what: &str, ready: impl Fn(&str) -> bool) -> String {
    let until = Instant::now() + Duration::from_secs(60);
    loop {
        let text = server.metrics().await;
        if ready(&text) {
            return text;
        }
        assert!(Instant::now() < until, "never saw {what}:\n{text}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

const TTFT: [f64; 22] = [
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
    20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
];
const TPOT: [f64; 19] = [
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
    40.0, 80.0,
];
const E2E: [f64; 21] = [
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0,
    480.0, 960.0, 1920.0, 7680.0,
];

/// Six words: six prompt tokens and six echoed tokens, 150 ms apart.
const SIX_WORDS: &str = "one two three four five six";

#[tokio::test]
async fn protocol_metrics_follow_the_load_and_parse_with_the_reference_parsers() {
    let server = Server::start(&echo_config()).await;
    let mut texts = vec![server.metrics().await]; // 0: idle

    // One request on `slow`: one running row.
    let chat = |model: &str| json!({"model": model, "messages": user(SIX_WORDS)});
    let first = server.chat_in_background(chat("chat"));
    texts.push(
        scrape_until(&server, "one running row on slow", |t| {
            peek(t, "vllm:num_requests_running", SLOW) == Some(1.0)
                && peek(t, "vllm:kv_cache_usage_perc", SLOW).is_some_and(|kv| kv > 0.0)
        })
        .await,
    ); // 1
       // Four more: both slots run, three wait.
    let more: Vec<_> = (0..4)
        .map(|_| server.chat_in_background(chat("assistant")))
        .collect();
    texts.push(
        scrape_until(&server, "two running and three waiting on slow", |t| {
            peek(t, "vllm:num_requests_running", SLOW) == Some(2.0)
                && peek(t, "vllm:num_requests_waiting", SLOW) == Some(3.0)
                // Both rows hold their prompts (a row is counted running just before).
                && peek(t, "vllm:kv_cache_usage_perc", SLOW).is_some_and(|kv| kv >= 12.0 / 32.0)
        })
        .await,
    ); // 2
       // The 2.0 plugin: one request, then two.
    let old_one = server.chat_in_background(chat("legacy"));
    texts.push(
        scrape_until(&server, "one running on old", |t| {
            peek(t, "vllm:num_requests_running", OLD) == Some(1.0)
        })
        .await,
    ); // 3
    let old_two = server.chat_in_background(chat("legacy"));
    texts.push(
        scrape_until(&server, "two running on old", |t| {
            peek(t, "vllm:num_requests_running", OLD) == Some(2.0)
        })
        .await,
    ); // 4

    for reply in [first, old_one, old_two].into_iter().chain(more) {
        let body: Value = serde_json::from_str(&reply.await.unwrap()).unwrap();
        assert_eq!(
            body["choices"][0]["message"]["content"], SIX_WORDS,
            "{body}"
        );
    }
    texts.push(
        scrape_until(&server, "slow and old idle", |t| {
            [SLOW, OLD].iter().all(|&of| {
                peek(t, "vllm:num_requests_running", of) == Some(0.0)
                    && peek(t, "vllm:num_requests_waiting", of) == Some(0.0)
            })
        })
        .await,
    ); // 5

    let s = parse(&texts);
    // Idle: nothing waits or runs, no KV in use; the adapters are named.
    for of in [SLOW, OLD] {
        assert_eq!(s[0].gauge("vllm:num_requests_waiting", of), 0.0);
        assert_eq!(s[0].gauge("vllm:num_requests_running", of), 0.0);
        assert_eq!(s[0].gauge("vllm:kv_cache_usage_perc", of), 0.0);
    }
    let (labels, stamp) = s[0].lora(SLOW).expect("slow has adapters");
    assert_eq!(labels["max_lora"], "2");
    assert_eq!(labels["running_lora_adapters"], "alpha,beta");
    assert_eq!(labels["waiting_lora_adapters"], "");
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64();
    assert!(
        stamp > now - 600.0 && stamp <= now,
        "{stamp} is not a recent Unix time"
    );
    // A 2.0 plugin reports no adapters: no series, as vLLM without LoRA.
    assert_eq!(s[0].lora(OLD), None);

    // slow, one row: 6 prompt positions plus 0..=6 tokens, of 2 × 16 (echo's accounting).
    let kv1 = s[1].gauge("vllm:kv_cache_usage_perc", SLOW);
    assert!((6.0 / 32.0..=12.0 / 32.0).contains(&kv1), "{kv1}");
    assert_eq!(s[1].gauge("vllm:num_requests_waiting", SLOW), 0.0);
    // Two rows and three waiting: twice the prompt positions at least, never above 1.
    let kv2 = s[2].gauge("vllm:kv_cache_usage_perc", SLOW);
    assert!(
        kv2 > kv1 && (12.0 / 32.0..=24.0 / 32.0).contains(&kv2),
        "{kv1} then {kv2}"
    );
    assert_eq!(s[2].gauge("vllm:num_requests_waiting", SLOW), 3.0);
    // The adapters did not change, so neither did the timestamp.
    assert_eq!(s[2].lora(SLOW).unwrap().1, stamp);

    // The 2.0 plugin: its fallback KV fraction is the share of its slots in use.
    assert_eq!(s[3].gauge("vllm:kv_cache_usage_perc", OLD), 0.5);
    assert_eq!(s[4].gauge("vllm:kv_cache_usage_perc", OLD), 1.0);

    // All done: the gauges are back to 0, and the counters and histograms add up.
    for of in [SLOW, OLD] {
        assert_eq!(s[5].gauge("vllm:kv_cache_usage_perc", of), 0.0);
    }
    let (requests, words) = (5.0, 6.0);
    assert_eq!(s[5].counter("vllm:prompt_tokens", SLOW), requests * words);
    assert_eq!(
        s[5].counter("vllm:generation_tokens", SLOW),
        requests * words
    );
    assert_eq!(s[5].counter("vllm:generation_tokens", OLD), 2.0 * words);
    let ttft = s[5].histogram("vllm:time_to_first_token_seconds", SLOW, &TTFT);
    assert_eq!(ttft.last().unwrap().1, requests);
    // Every first token comes after one 150 ms delay at least.
    assert_eq!(ttft.iter().find(|b| b.0 == 0.1).unwrap().1, 0.0);
    // One observation per token after the first (the host's clock, so no bound on each gap).
    let tpot = s[5].histogram("vllm:time_per_output_token_seconds", SLOW, &TPOT);
    assert_eq!(tpot.last().unwrap().1, requests * (words - 1.0));
    let e2e = s[5].histogram("vllm:e2e_request_latency_seconds", SLOW, &E2E);
    assert_eq!(e2e.last().unwrap().1, requests);
    // Six tokens 150 ms apart: 0.9 s at least.
    assert_eq!(e2e.iter().find(|b| b.0 == 0.8).unwrap().1, 0.0);
}

#[tokio::test]
async fn phi4mm_reports_the_kv_positions_of_its_rows_and_its_resident_adapters() {
    let server = Server::start(&phi4mm_config()).await;
    let mut texts = vec![server.metrics().await]; // 0: idle

    // Phi4MM: a running row holds KV positions (few, against a default pool of one
    // 4096-position row per slot), so the fraction is above 0 while it runs. A greedy row of
    // random weights may stop early: a few tries.
    let mut phi_running = None;
    for _ in 0..5 {
        let request = server.chat_in_background(json!({
            "model": "phi4mm", "max_tokens": 1024, "temperature": 0, "messages": user("Hello there"),
        }));
        while !request.is_finished() {
            let text = server.metrics().await;
            if peek(&text, "vllm:num_requests_running", PHI) == Some(1.0)
                && peek(&text, "vllm:kv_cache_usage_perc", PHI).is_some_and(|kv| kv > 0.0)
            {
                phi_running = Some(text);
                break;
            }
        }
        let _ = request.await;
        if phi_running.is_some() {
            break;
        }
    }
    texts.push(phi_running.expect("a scrape while a Phi4MM row ran")); // 1
    texts.push(server.metrics().await); // 2: after

    let s = parse(&texts);
    assert_eq!(s[0].gauge("vllm:num_requests_waiting", PHI), 0.0);
    assert_eq!(s[0].gauge("vllm:num_requests_running", PHI), 0.0);
    assert_eq!(s[0].gauge("vllm:kv_cache_usage_perc", PHI), 0.0);
    // Both adapters live in the checkpoint: resident, and none waits.
    let (labels, _) = s[0].lora(PHI).expect("phi4mm has adapters");
    assert_eq!(labels["max_lora"], "2");
    assert_eq!(labels["running_lora_adapters"], "speech,vision");
    assert_eq!(labels["waiting_lora_adapters"], "");
    // Phi4MM while a row runs: in (0, 1), and no more than the row's prompt and budget hold.
    let kv = s[1].gauge("vllm:kv_cache_usage_perc", PHI);
    assert!(kv > 0.0 && kv <= (64.0 + 1024.0) / (2.0 * 131072.0), "{kv}");
    assert_eq!(s[1].gauge("vllm:num_requests_running", PHI), 1.0);
    assert_eq!(s[2].gauge("vllm:kv_cache_usage_perc", PHI), 0.0);
    assert!(s[2].counter("vllm:prompt_tokens", PHI) > 0.0);
    assert!(s[2].counter("vllm:generation_tokens", PHI) > 0.0);
}

/// The (instance, model_name) of every `vllm:prompt_tokens` series in a scrape, sorted, as the
/// reference parser reads them.
fn prompt_token_series(text: &str) -> Vec<(String, String)> {
    let scrape = parse(&[text.to_string()]).remove(0);
    let family = scrape.family("vllm:prompt_tokens", "counter");
    let mut series: Vec<_> = family["samples"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|s| s[0] == "vllm:prompt_tokens_total")
        .map(|s| {
            let label = |name: &str| s[1][name].as_str().unwrap_or_default().to_string();
            (label("instance"), label("model_name"))
        })
        .collect();
    series.sort();
    series
}

/// One series per serving instance from its start, so an idle instance shows zeros; a reload
/// that renames an instance's route moves its series to the new name, and an instance the
/// reload removes loses its series once it has stopped. Before, an instance had no series
/// until its first request, and the old names' series stayed beside the new ones.
#[tokio::test]
async fn every_serving_instance_has_its_series_and_no_other_does() {
    let config = |route: &str, with_b: bool| {
        let b = if with_b {
            "[[models]]\nname = \"b\"\nplugin = \"echo\"\nkind = \"echo\"\n"
        } else {
            ""
        };
        format!(
            "[[plugins]]\nname = \"echo\"\npath = \"{}\"\n\
             [[models]]\nname = \"a\"\nplugin = \"echo\"\nkind = \"echo\"\n{b}\
             [[routes]]\nmodels = [\"{route}\"]\nbackends = [{{ model = \"a\" }}]\n",
            plugin_lib("echo").display()
        )
    };
    let pair = |i: &str, m: &str| (i.to_string(), m.to_string());
    let server = Server::start(&config("assistant", true)).await;
    let text = server.metrics().await;
    assert_eq!(
        prompt_token_series(&text),
        [pair("a", "assistant"), pair("b", "b")],
        "{text}"
    );
    let reply = server
        .chat(json!({"model": "assistant", "messages": user("one two")}))
        .await;
    assert_eq!(reply.status, 200);

    server.rewrite_config(&config("helper", false));
    let (status, report) = server.reload().await;
    assert_eq!(status, 200, "{report}");
    scrape_until(&server, "only the reloaded instance's series", |text| {
        prompt_token_series(text) == [pair("a", "helper")]
    })
    .await;
}

/// The gauges list the instances in the config's order on every scrape and after a reload: a
/// picker without a selector takes a name's first series, and must find the same instance each
/// time. (Names chosen so that a hash map's order is unlikely to be this one.)
#[tokio::test]
async fn the_gauges_list_the_instances_in_the_configs_order_scrape_after_scrape() {
    let names = ["zeta", "alpha", "mid", "beta", "omega", "delta"];
    let config = |label: &str| {
        let mut text = format!(
            "[[plugins]]\nname = \"echo\"\npath = \"{}\"\n",
            plugin_lib("echo").display()
        );
        for name in names {
            text.push_str(&format!(
                "[[models]]\nname = \"{name}\"\nplugin = \"echo\"\nkind = \"echo\"\n\
                 settings = {{ label = \"{label}\" }}\n"
            ));
        }
        text
    };
    let order = |text: &str, family: &str| -> Vec<String> {
        text.lines()
            .filter(|l| l.starts_with(family))
            .map(|l| {
                l.split("instance=\"")
                    .nth(1)
                    .unwrap()
                    .split('"')
                    .next()
                    .unwrap()
                    .to_string()
            })
            .collect()
    };
    let server = Server::start(&config("first")).await;
    let check = |text: &str| {
        for family in [
            "vllm:num_requests_waiting{",
            "vllm:kv_cache_usage_perc{",
            "switchyard_in_flight{",
        ] {
            assert_eq!(order(text, family), names, "{family} in:\n{text}");
        }
    };
    for _ in 0..3 {
        check(&server.metrics().await);
    }
    // A changed setting makes every instance anew: a new map of instances behind the table.
    server.rewrite_config(&config("second"));
    let (status, report) = server.reload().await;
    assert_eq!(status, 200, "{report}");
    // The instances it retired, still stopping, share the current ones' labels: their gauges
    // add into the same series, in the same places.
    for _ in 0..3 {
        check(&server.metrics().await);
    }
}
