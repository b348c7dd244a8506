//! The plugin object (as the host drives it, without the FFI): chat with an image, with audio,
//! with both, a transcription, settings refusal, and a client that goes away freeing its slot.

use std::sync::mpsc::{channel, Sender};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::model_support::*;
use artifact_cache::Progress;
use switchyard_phi4mm::config::Phi4mmSettings;
use switchyard_phi4mm::plugin::Phi4mmModel;
use switchyard_plugin_api::abi_stable::sabi_trait::TD_Opaque;
use switchyard_plugin_api::{
    Endpoint, ErrorKind, Event, EventSink, EventSinkBox, EventSink_TO, FinishReason, Message, Part,
    PluginModel, Request, Role, SamplingParams,
};

struct Sink {
    tx: Mutex<Sender<Event>>,
    /// Report the client gone after this many tokens.
    gone_after: Option<usize>,
    seen: Mutex<usize>,
}

impl Sink {
    /// A sink into `tx`, as the host hands the plugin one; `gone_after` as in [`Sink`].
    fn boxed(tx: Sender<Event>, gone_after: Option<usize>) -> EventSinkBox {
        EventSink_TO::from_value(
            Sink {
                tx: Mutex::new(tx),
                gone_after,
                seen: Mutex::new(0),
            },
            TD_Opaque,
        )
    }
}

impl EventSink for Sink {
    fn send(&self, event: Event) -> bool {
        if matches!(event, Event::Token { .. }) {
            let mut seen = self.seen.lock().unwrap();
            *seen += 1;
            if self.gone_after.is_some_and(|n| *seen > n) {
                return false;
            }
        }
        let _ = self.tx.lock().unwrap().send(event);
        true
    }
}

fn model(extra: &str) -> Phi4mmModel {
    let json = format!(
        r#"{{"checkpoint": {:?}, "slots": 2, "max_queued": 2, "default_max_tokens": 6 {extra}}}"#,
        fixture().join("model").display().to_string()
    );
    let settings: Phi4mmSettings = serde_json::from_str(&json).unwrap();
    Phi4mmModel::load(settings, 2, &|_| {}, Progress::none()).unwrap()
}

/// Loads the checkpoint at `dir` with `extra` settings (`"key": value, ...`, each after a comma)
/// on a budget of `threads` host threads.
fn load_at(
    dir: &std::path::Path,
    extra: &str,
    threads: usize,
) -> Result<Phi4mmModel, switchyard_plugin_api::PluginError> {
    let json = format!(
        r#"{{"checkpoint": {:?} {extra}}}"#,
        dir.display().to_string()
    );
    let settings: Phi4mmSettings = serde_json::from_str(&json).unwrap();
    Phi4mmModel::load(settings, threads, &|_| {}, Progress::none())
}

/// The message of a load's refusal; `what` names the case if it was accepted.
fn refusal(loaded: Result<Phi4mmModel, switchyard_plugin_api::PluginError>, what: &str) -> String {
    match loaded {
        Ok(_) => panic!("{what} was accepted"),
        Err(e) => e.message.to_string(),
    }
}

fn request(id: u64, endpoint: Endpoint, parts: Vec<Part>, max: u32) -> Request {
    Request {
        sampling: SamplingParams {
            max_tokens: Some(max).into(),
            ..SamplingParams::default()
        },
        ..Request::new(
            id,
            endpoint,
            vec![Message {
                role: Role::User,
                parts: parts.into(),
            }],
        )
    }
}

fn input(name: &str) -> Vec<u8> {
    std::fs::read(fixture().join("inputs").join(name)).unwrap()
}

/// Submits and collects events up to the terminal one.
fn run(m: &Phi4mmModel, req: Request, gone_after: Option<usize>) -> Vec<Event> {
    let (tx, rx) = channel();
    let sink = Sink::boxed(tx, gone_after);
    m.submit(req, sink).unwrap();
    let mut events = Vec::new();
    while let Ok(e) = rx.recv_timeout(Duration::from_secs(if gone_after.is_some() {
        5
    } else {
        120
    })) {
        let end = matches!(e, Event::Finished { .. } | Event::Failed(_));
        events.push(e);
        if end {
            break;
        }
    }
    events
}

fn finished(events: &[Event]) -> (FinishReason, u32, u32) {
    match events.last() {
        Some(Event::Finished { reason, usage }) => {
            (*reason, usage.prompt_tokens, usage.completion_tokens)
        }
        other => panic!("no Finished: {other:?}"),
    }
}

fn wait_idle(m: &Phi4mmModel) {
    let t0 = Instant::now();
    loop {
        let s = m.stats();
        if s.running == 0 && s.queued == 0 && s.free_slots == 2 {
            assert!(s.adapters.iter().all(|a| a.rows == 0));
            return;
        }
        assert!(t0.elapsed() < Duration::from_secs(60), "not idle: {s:?}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn chat_with_media_and_transcription() {
    let m = Arc::new(model(""));
    let text = |t: &str| Part::Text(t.into());
    let image = || Part::Image(input("img_small.png").into());
    let audio = || Part::Audio {
        data: input("audio_16k.wav").into(),
        format: "wav".into(),
    };
    let cases = [
        (Endpoint::Chat, vec![text("Hello there")]),
        (Endpoint::Chat, vec![image(), text("What is shown?")]),
        (Endpoint::Chat, vec![audio(), text("What is said?")]),
        (Endpoint::Chat, vec![image(), audio(), text("Both?")]),
        (Endpoint::Transcription, vec![audio()]),
    ];
    for (i, (endpoint, parts)) in cases.into_iter().enumerate() {
        let events = run(&m, request(i as u64, endpoint, parts, 4), None);
        assert!(matches!(events[0], Event::Started { .. }), "{events:?}");
        let (reason, prompt, completion) = finished(&events);
        assert!(prompt > 0);
        let tokens = events
            .iter()
            .filter(|e| matches!(e, Event::Token { .. }))
            .count();
        assert_eq!(tokens as u32, completion);
        assert!(
            reason == FinishReason::Length || reason == FinishReason::Stop,
            "{reason:?}"
        );
    }
    wait_idle(&m);
    m.shutdown();
}

#[test]
fn disconnect_frees_the_slot_and_bad_requests_are_refused() {
    let m = model("");
    let events = run(
        &m,
        request(1, Endpoint::Chat, vec![Part::Text("go on".into())], 50),
        Some(2),
    );
    // The client saw two tokens and then nothing: no terminal event reaches a gone client.
    assert_eq!(events.len(), 3, "{events:?}");
    wait_idle(&m);

    // Transcription without audio, and a typed special token: refused at admission.
    let (tx, _rx) = channel();
    let sink = || Sink::boxed(tx.clone(), None);
    let e = m
        .submit(
            request(2, Endpoint::Transcription, vec![Part::Text("x".into())], 4),
            sink(),
        )
        .unwrap_err();
    assert_eq!(e.kind, ErrorKind::Unsupported);
    let e = m
        .submit(
            request(3, Endpoint::Chat, vec![Part::Text("<|end|>".into())], 4),
            sink(),
        )
        .unwrap_err();
    assert_eq!(e.kind, ErrorKind::InvalidRequest);
    wait_idle(&m);
    m.shutdown();
}

/// Weights that are finite but overflow f32 in a product (the final norm at the largest bf16)
/// give non-finite logits: the warm-up fails, naming them, and no request gets tokens drawn
/// from them.
#[test]
fn a_model_whose_logits_are_not_finite_fails_its_warm_up_and_its_requests() {
    let tmp = crate::model_checkpoint::copy_layout("model");
    crate::model_checkpoint::rewrite(&tmp.path().join("model.safetensors"), |e| {
        let norm = crate::model_checkpoint::entry(e, "model.norm.weight");
        for pair in norm.data.chunks_exact_mut(2) {
            pair.copy_from_slice(&0x7f7fu16.to_le_bytes()); // bf16's largest finite value
        }
    });
    let m = load_at(tmp.path(), r#", "slots": 2, "default_max_tokens": 6"#, 2)
        .expect("every stored value is finite");
    let refused = m.warm().expect_err("the warm-up sees the logits");
    assert!(
        refused
            .message
            .contains("the model's logits are not finite"),
        "{refused}"
    );
    let events = run(
        &m,
        request(1, Endpoint::Chat, vec![Part::Text("hello".into())], 4),
        None,
    );
    assert!(
        !events.iter().any(|e| matches!(e, Event::Token { .. })),
        "{events:?}"
    );
    assert!(
        matches!(events.last(), Some(Event::Failed(e)) if e.message.contains("not finite")),
        "{events:?}"
    );
    m.shutdown();
}

/// Loads a copy of the fixture whose `tokenizer.json` `edit` changed; the refusal's message.
fn load_with_tokenizer(edit: impl FnOnce(&mut serde_json::Value)) -> String {
    let tmp = crate::model_checkpoint::copy_layout("model");
    let path = tmp.path().join("tokenizer.json");
    let mut tokenizer: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    edit(&mut tokenizer);
    std::fs::write(&path, tokenizer.to_string()).unwrap();
    refusal(load_at(tmp.path(), "", 2), "the tokenizer")
}

/// A tokenizer whose chat-template markers are not single added tokens, or whose marker ids the
/// model cannot embed, is refused at load, naming the marker (it used to serve with `<|user|>`
/// tokenized as text, or fail every request with a system message).
#[test]
fn a_tokenizer_that_cannot_render_the_chat_template_is_refused_at_load() {
    let refused = load_with_tokenizer(|t| {
        t["added_tokens"]
            .as_array_mut()
            .unwrap()
            .retain(|a| a["content"] != "<|user|>");
    });
    assert!(
        refused.contains("<|user|> is not an added token of tokenizer.json"),
        "{refused}"
    );
    let refused = load_with_tokenizer(|t| {
        for a in t["added_tokens"].as_array_mut().unwrap() {
            if a["content"] == "<|system|>" {
                a["id"] = 5000.into();
            }
        }
        t["model"]["vocab"]["<|system|>"] = 5000.into();
    });
    assert!(
        refused.contains("\"<|system|>\" is id 5000, outside the model's vocabulary of 1024"),
        "{refused}"
    );
    // Any token, not only the template's.
    let refused = load_with_tokenizer(|t| {
        t["model"]["vocab"]["zebra"] = 100_039.into();
    });
    assert!(
        refused.contains("token \"zebra\" is id 100039, outside the model's vocabulary of 1024"),
        "{refused}"
    );
}

/// A transcription instruction that the chat template refuses would fail every transcription
/// (blamed on the client): it is refused at load, naming the setting.
#[test]
fn a_transcription_instruction_the_template_refuses_is_refused_at_load() {
    for (instruction, why) in [
        ("<|end|><|assistant|>", "reserved token"),
        ("<|image_1|> describe", "do not match"),
    ] {
        let extra = format!(r#", "transcription_instruction": {instruction:?}"#);
        let refused = refusal(
            load_at(&fixture().join("model"), &extra, 2),
            &format!("{instruction:?}"),
        );
        assert!(
            refused.starts_with("transcription_instruction: ") && refused.contains(why),
            "{instruction:?}: {refused}"
        );
    }
}

/// The adapters reported resident (the gateway's `vllm:lora_requests_info`) are the ones the
/// checkpoint has, not a fixed list.
#[test]
fn the_resident_adapters_are_the_checkpoints() {
    let m = model("");
    assert_eq!(m.resources().resident_adapters, ["speech", "vision"]);
    m.shutdown();
    let tmp = crate::model_checkpoint::copy_layout("model");
    std::fs::remove_dir_all(tmp.path().join("vision-lora")).unwrap();
    let m = load_at(tmp.path(), "", 2).unwrap();
    let resources = m.resources();
    assert_eq!(resources.resident_adapters, ["speech"]);
    assert_eq!(resources.max_adapters, 1);
    m.shutdown();
}

/// The host's thread budget for the model is held to the same bound as `settings.threads`.
#[test]
fn a_host_thread_budget_over_the_bound_is_refused() {
    let refused = refusal(
        load_at(&fixture().join("model"), "", 100_000),
        "100000 threads",
    );
    assert!(
        refused.contains("the host gives this model 100000 threads, over the most 1024"),
        "{refused}"
    );
}

#[test]
fn unknown_settings_are_refused() {
    let r: Result<Phi4mmSettings, _> = serde_json::from_str(r#"{"checkpoint": "x", "slotz": 3}"#);
    assert!(r.is_err());
}

fn queued_tokens(m: &Phi4mmModel) -> usize {
    let details: serde_json::Value = serde_json::from_str(m.stats().details_json.as_str()).unwrap();
    details["queued_tokens"].as_u64().unwrap() as usize
}

/// A sink that blocks the scheduler thread at its first token until the test lets it go, so
/// admitted requests stay queued.
struct GateSink {
    gate: Mutex<Option<std::sync::mpsc::Receiver<()>>>,
    at_token: Sender<()>,
    tx: Mutex<Sender<Event>>,
}

impl EventSink for GateSink {
    fn send(&self, event: Event) -> bool {
        if matches!(event, Event::Token { .. }) {
            if let Some(gate) = self.gate.lock().unwrap().take() {
                let _ = self.at_token.send(());
                let _ = gate.recv_timeout(Duration::from_secs(120));
            }
        }
        let _ = self.tx.lock().unwrap().send(event);
        true
    }
}

/// Media are charged at their real token cost at admission: with a small token bound and a
/// request already queued, a chat with a large image is refused as overloaded (it was charged
/// one token per image before), a text-only chat with the same text is admitted, and the charge
/// of the admitted fixture requests equals their prompt length after preparation.
#[test]
fn media_are_charged_at_their_token_cost_at_admission() {
    let m = model(r#", "max_queued_tokens": 1200"#);
    let sink = || {
        let (tx, rx) = channel();
        let sink = Sink::boxed(tx, None);
        (sink, rx)
    };
    let (tx, _rx1) = channel();
    // Request 1 takes a slot and freezes the scheduler at its first token.
    let (go, gate) = channel();
    let (at_token_tx, at_token) = channel();
    let gated = EventSink_TO::from_value(
        GateSink {
            gate: Mutex::new(Some(gate)),
            at_token: at_token_tx,
            tx: Mutex::new(tx.clone()),
        },
        TD_Opaque,
    );
    m.submit(
        request(1, Endpoint::Chat, vec![Part::Text("hi".into())], 4),
        gated,
    )
    .unwrap();
    at_token
        .recv_timeout(Duration::from_secs(120))
        .expect("request 1 runs");

    let text = || Part::Text("What is shown in this picture?".into());
    let image = |name: &str| Part::Image(input(name).into());
    let audio = || Part::Audio {
        data: input("audio_16k.wav").into(),
        format: "wav".into(),
    };
    // Admitted requests and the charge each added to the queue.
    let mut charges = Vec::new();
    let admit = |charges: &mut Vec<_>, id: u64, parts: Vec<Part>| {
        let before = queued_tokens(&m);
        let (s, rx) = sink();
        m.submit(request(id, Endpoint::Chat, parts, 2), s).unwrap();
        charges.push((id, queued_tokens(&m) - before, rx));
    };
    admit(&mut charges, 2, vec![image("img_small.png"), text()]);
    let small_image = charges[0].1;
    assert!(
        small_image > 273,
        "the image counts its tokens: {small_image}"
    );
    admit(&mut charges, 3, vec![audio(), text()]);
    assert!(
        charges[1].1 > 20,
        "the clip counts its tokens: {}",
        charges[1].1
    );

    // A large image does not fit what is left of the bound.
    let queued = queued_tokens(&m);
    let e = m
        .submit(
            request(
                4,
                Endpoint::Chat,
                vec![image("img_maxcrops.png"), text()],
                2,
            ),
            sink().0,
        )
        .unwrap_err();
    assert_eq!(e.kind, ErrorKind::Overloaded, "{e:?}");
    assert!(e.message.contains("prompt tokens"), "{e:?}");
    assert_eq!(queued_tokens(&m), queued, "a refusal changes nothing");
    // The same text without the image is admitted.
    admit(&mut charges, 5, vec![text()]);

    // A medium whose header cannot be read is refused at admission as a bad request.
    let e = m
        .submit(
            request(
                6,
                Endpoint::Chat,
                vec![Part::Image(b"not an image".to_vec().into()), text()],
                2,
            ),
            sink().0,
        )
        .unwrap_err();
    assert_eq!(e.kind, ErrorKind::InvalidRequest, "{e:?}");

    go.send(()).unwrap();
    for (id, charge, rx) in &charges {
        let events: Vec<Event> =
            std::iter::from_fn(|| rx.recv_timeout(Duration::from_secs(120)).ok())
                .take_while(|e| !matches!(e, Event::Failed(_)))
                .scan(false, |done, e| {
                    (!*done).then(|| {
                        *done = matches!(e, Event::Finished { .. });
                        e
                    })
                })
                .collect();
        let (_, prompt, _) = finished(&events);
        assert_eq!(
            prompt as usize, *charge,
            "request {id}: charge = prompt after preparation"
        );
    }
    wait_idle(&m);
    m.shutdown();
}

/// A `kv_cache_bytes` without room for an ordinary request (a one-word chat with the default
/// budget) is refused by the settings check, which `config check` and every reload run before
/// loading; the bound it names is the one serving holds to: with a pool of exactly that many
/// bytes such a chat is served, with one byte less it is refused, naming `kv_cache_bytes`.
#[test]
fn the_settings_check_refuses_a_kv_pool_that_holds_no_ordinary_request() {
    use switchyard_plugin_api::SettingsText;
    let model = fixture().join("model");
    let settings = r#""default_max_tokens": 6"#;
    let check = |pool: u64| {
        let json = format!(
            r#"{{"checkpoint": {:?}, "kv_cache_bytes": {pool}, {settings}}}"#,
            model.display().to_string()
        );
        switchyard_phi4mm::plugin::check_settings("phi4mm", SettingsText::json(json), &model)
    };
    let refused = check(1000).expect_err("a 1000-byte pool holds no row");
    let message = refused.message.to_string();
    assert!(
        message.contains("kv_cache_bytes = 1000 holds no ordinary request"),
        "{message}"
    );
    let needed: u64 = message
        .split("needs ")
        .nth(1)
        .and_then(|rest| rest.split(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no byte count in {message}"));
    check(needed).expect("the named size is enough for the check");
    let hello = || {
        Request::new(
            7,
            Endpoint::Chat,
            vec![Message {
                role: Role::User,
                parts: vec![Part::Text("Hello".into())].into(),
            }],
        )
    };
    let pool = |bytes: u64| {
        let m = load_at(
            &model,
            &format!(r#", "slots": 1, "kv_cache_bytes": {bytes}, {settings}"#),
            1,
        )
        .expect("loads");
        m.warm().expect("the warm-up's row is smaller");
        m
    };
    let tight = pool(needed);
    let events = run(&tight, hello(), None);
    assert_eq!(finished(&events).2, 6, "{events:?}");
    tight.shutdown();
    let short = pool(needed - 1);
    let (tx, _rx) = channel();
    let sink = Sink::boxed(tx, None);
    let refused = short.submit(hello(), sink).expect_err("one byte less");
    assert!(refused.message.contains("kv_cache_bytes"), "{refused:?}");
    short.shutdown();
}

/// A transcription's budget follows its clip only as far as the longest row the instance can
/// hold leaves room: a clip whose prompt fits with `default_max_tokens` after it is
/// transcribed, however small the KV pool, as it was before the budget followed the clip.
#[test]
fn a_transcriptions_budget_stays_within_the_longest_row() {
    let clip = || {
        let mut r = Request::new(
            0,
            Endpoint::Transcription,
            vec![Message {
                role: Role::User,
                parts: vec![Part::Audio {
                    data: input("audio_long_16k.wav").into(),
                    format: "wav".into(),
                }]
                .into(),
            }],
        );
        r.sampling.max_tokens = None.into();
        r
    };
    let model = fixture().join("model");
    // An instance with room to spare: the budget is the prompt's token count.
    let roomy = load_at(&model, r#", "slots": 1, "default_max_tokens": 8"#, 1).unwrap();
    let events = run(&roomy, clip(), None);
    let (_, prompt, completion) = finished(&events);
    assert!(
        completion > 8 && completion <= prompt,
        "{prompt} {completion}"
    );
    roomy.shutdown();
    // A pool whose longest row is the prompt and 40 positions more: 40 tokens, not a refusal.
    let structure = switchyard_phi4mm::checkpoint::Checkpoint::open_structure(&model).unwrap();
    let pool =
        switchyard_phi4mm::model::kv_cache::row_bytes(&structure.config.text, prompt as usize + 40);
    let tight = load_at(
        &model,
        &format!(r#", "slots": 1, "default_max_tokens": 8, "kv_cache_bytes": {pool}"#),
        1,
    )
    .unwrap();
    let events = run(&tight, clip(), None);
    let (_, _, completion) = finished(&events);
    assert_eq!(completion, 40, "{events:?}");
    tight.shutdown();
}
