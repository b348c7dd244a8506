//! Malformed, truncated and hostile inputs: each gives a typed error, never a panic or an
//! allocation sized from an attacker's header.

use std::io::Cursor;
use switchyard_fixtures::crafted::{flac_constant, png_bomb_header, png_iccp_bomb, wav_header};
use switchyard_phi4mm_frontend::audio::{
    self, AudioError, AudioOptions, RequestAudioError, ResampleMode, SampleLimit,
};
use switchyard_phi4mm_frontend::image::{self, ImageError, ImageOptions};
use switchyard_phi4mm_frontend::limits::{LimitError, Limits};
use switchyard_phi4mm_frontend::prompt::{ContentPart, Message, Prompt, PromptError, Role};

fn wav<S: hound::Sample + Copy>(spec: hound::WavSpec, samples: &[S]) -> Vec<u8> {
    let mut cursor = Cursor::new(Vec::new());
    let mut writer = hound::WavWriter::new(&mut cursor, spec).unwrap();
    for &s in samples {
        writer.write_sample(s).unwrap();
    }
    writer.finalize().unwrap();
    cursor.into_inner()
}

fn spec(rate: u32, channels: u16, bits: u16, float: bool) -> hound::WavSpec {
    let sample_format = if float {
        hound::SampleFormat::Float
    } else {
        hound::SampleFormat::Int
    };
    hound::WavSpec {
        channels,
        sample_rate: rate,
        bits_per_sample: bits,
        sample_format,
    }
}

#[test]
fn wav_header_claiming_4_gb_is_refused_before_allocation() {
    let mut bytes = wav_header(16000, 1, 16, 1, 0xFFFF_FFF0);
    bytes.extend_from_slice(&[0; 64]);
    // 2^31 samples at 16 kHz is 37 hours: the duration limit refuses it from the header.
    let err = audio::features_from_bytes(&bytes, &AudioOptions::default()).unwrap_err();
    assert!(matches!(err, AudioError::TooLong { .. }), "{err}");
    assert!(err.to_string().contains("max_audio_seconds"), "{err}");
    // With no duration limit the claim is checked against the bytes actually present.
    let unlimited = AudioOptions {
        max_seconds: f64::INFINITY,
        ..AudioOptions::default()
    };
    let err = audio::features_from_bytes(&bytes, &unlimited).unwrap_err();
    assert!(matches!(err, AudioError::Wav(_)), "{err}");
}

#[test]
fn truncated_wav_data_is_an_error() {
    let full = wav(spec(16000, 1, 16, false), &vec![1000i16; 2000]);
    let err = audio::features_from_bytes(&full[..full.len() - 1001], &AudioOptions::default())
        .unwrap_err();
    assert!(matches!(err, AudioError::Wav(_)), "{err}");
    // Cut inside the header.
    let err = audio::features_from_bytes(&full[..30], &AudioOptions::default()).unwrap_err();
    assert!(matches!(err, AudioError::Wav(_)), "{err}");
}

#[test]
fn zero_length_and_too_short_clips_are_errors() {
    assert!(matches!(
        audio::features_from_bytes(&[], &AudioOptions::default()),
        Err(AudioError::Empty)
    ));
    let empty_wav = wav::<i16>(spec(16000, 1, 16, false), &[]);
    assert!(matches!(
        audio::features_from_bytes(&empty_wav, &AudioOptions::default()),
        Err(AudioError::Empty)
    ));
    assert!(matches!(
        audio::features_from_samples(&[], 16000, &AudioOptions::default()),
        Err(AudioError::Empty)
    ));
    let short = wav(spec(16000, 1, 16, false), &[5i16; 399]);
    let err = audio::features_from_bytes(&short, &AudioOptions::default()).unwrap_err();
    assert!(
        matches!(err, AudioError::TooShort { samples: 399, .. }),
        "{err}"
    );
}

#[test]
fn nan_and_infinite_samples_are_errors() {
    let mut samples = vec![0.1f32; 1000];
    samples[321] = f32::NAN;
    let bytes = wav(spec(16000, 1, 32, true), &samples);
    let err = audio::features_from_bytes(&bytes, &AudioOptions::default()).unwrap_err();
    assert!(
        matches!(err, AudioError::NonFinite { index: 321, .. }),
        "{err}"
    );
    samples[321] = f32::INFINITY;
    let bytes = wav(spec(16000, 1, 32, true), &samples);
    assert!(matches!(
        audio::features_from_bytes(&bytes, &AudioOptions::default()),
        Err(AudioError::NonFinite { .. })
    ));
}

/// Float samples far beyond full scale are refused naming the bound: past about 1e15 the
/// features saturated, and at 3e38 they came out all zero, a silent clip answered with 200.
/// A hot clip, a little over full scale, is read as it is.
#[test]
fn samples_far_beyond_full_scale_are_refused() {
    let mut samples = vec![0.1f32; 16000];
    samples[500] = 3e38;
    let bytes = wav(spec(16000, 1, 32, true), &samples);
    let err = audio::features_from_bytes(&bytes, &AudioOptions::default()).unwrap_err();
    assert!(
        matches!(err, AudioError::OutOfRange { index: 500, .. }),
        "{err}"
    );
    assert!(err.to_string().contains("beyond ±1e6"), "{err}");
    samples[500] = 2.0;
    let bytes = wav(spec(16000, 1, 32, true), &samples);
    assert!(audio::features_from_bytes(&bytes, &AudioOptions::default()).is_ok());
}

#[test]
fn unsupported_rates_and_garbage_are_errors() {
    for rate in [4000, 7999, 400_000] {
        let bytes = wav(spec(rate, 1, 16, false), &[0i16; 4000]);
        let err = audio::features_from_bytes(&bytes, &AudioOptions::default()).unwrap_err();
        assert!(
            matches!(err, AudioError::SampleRate(r) if r == rate),
            "{rate}: {err}"
        );
    }
    assert!(matches!(
        audio::features_from_samples(&[0.0; 1000], 0, &AudioOptions::default()),
        Err(AudioError::SampleRate(0))
    ));
    let err = audio::features_from_bytes(
        b"definitely not audio, just some bytes",
        &AudioOptions::default(),
    )
    .unwrap_err();
    assert!(matches!(err, AudioError::Unsupported(_)), "{err}");
    // A RIFF/WAVE with an A-law format tag, or of 64-bit floats, is refused as unsupported, not
    // misread, and the refusal lists what is read.
    let mut alaw = wav_header(8000, 1, 8, 6, 1000);
    alaw.extend_from_slice(&[0; 1000]);
    let mut float64 = wav_header(8000, 1, 64, 3, 8000);
    float64.extend_from_slice(&[0; 8000]);
    for (what, clip) in [("A-law", alaw), ("64-bit float", float64)] {
        let err = audio::features_from_bytes(&clip, &AudioOptions::default()).unwrap_err();
        assert!(matches!(err, AudioError::Unsupported(_)), "{what}: {err}");
        assert!(
            err.to_string().contains("accepted: WAV of 8-"),
            "{what}: {err}"
        );
    }
}

#[test]
fn oversized_clip_bytes_are_refused() {
    let bytes = wav(spec(16000, 1, 16, false), &[0i16; 1000]);
    let options = AudioOptions {
        max_bytes: 100,
        ..AudioOptions::default()
    };
    let err = audio::features_from_bytes(&bytes, &options).unwrap_err();
    assert!(
        matches!(err, AudioError::TooManyBytes { limit: 100, .. })
            && err.to_string().contains("max_audio_bytes")
    );
}

/// Every PCM width and multichannel averaging decode to soundfile's float values.
#[test]
fn wav_sample_formats_decode_like_soundfile() {
    let check = |bytes: Vec<u8>, want: &[f64]| {
        let decoded = audio::decode::decode(&bytes, 1e9).unwrap();
        assert_eq!(decoded.samples, want);
    };
    check(
        wav(spec(8000, 1, 8, false), &[-128i8, 0, 64]),
        &[-1.0, 0.0, 0.5],
    );
    check(
        wav(spec(8000, 1, 16, false), &[-32768i16, 16384]),
        &[-1.0, 0.5],
    );
    check(
        wav(spec(8000, 1, 24, false), &[-8_388_608i32, 4_194_304]),
        &[-1.0, 0.5],
    );
    check(
        wav(spec(8000, 1, 32, false), &[i32::MIN, 1 << 30]),
        &[-1.0, 0.5],
    );
    check(
        wav(spec(8000, 1, 32, true), &[0.25f32, -0.75]),
        &[0.25, -0.75],
    );
    // Stereo: channels averaged.
    check(
        wav(spec(8000, 2, 16, false), &[16384i16, 0, -32768, -16384]),
        &[0.25, -0.75],
    );
}

#[test]
fn png_header_of_100000_by_100000_is_refused_before_decoding() {
    let err = image::preprocess(&png_bomb_header(100_000, 100_000), &ImageOptions::default())
        .unwrap_err();
    assert!(
        matches!(
            err,
            ImageError::TooManyPixels {
                width: 100_000,
                height: 100_000,
                ..
            }
        ),
        "{err}"
    );
    assert!(err.to_string().contains("max_image_pixels"), "{err}");
}

#[test]
fn a_png_header_wider_than_any_buffer_is_refused_by_the_pixel_limit() {
    let err = image::preprocess(
        &png_bomb_header(i32::MAX as u32, 1),
        &ImageOptions::default(),
    )
    .unwrap_err();
    assert!(
        matches!(err, ImageError::TooManyPixels { width, .. } if width == i32::MAX as u32),
        "{err}"
    );
}

#[test]
fn malformed_images_are_errors() {
    let png = switchyard_fixtures::read("inputs/img_small.png");
    assert!(matches!(
        image::preprocess(&png[..png.len() / 2], &ImageOptions::default()),
        Err(ImageError::Decode(_))
    ));
    assert!(matches!(
        image::preprocess(&[], &ImageOptions::default()),
        Err(ImageError::Empty)
    ));
    assert!(matches!(
        image::preprocess(b"not an image at all", &ImageOptions::default()),
        Err(ImageError::UnsupportedFormat)
    ));
    let options = ImageOptions {
        max_bytes: 10,
        ..ImageOptions::default()
    };
    assert!(matches!(
        image::preprocess(&png, &options),
        Err(ImageError::TooManyBytes { .. })
    ));
    // A zero-sized header.
    assert!(image::preprocess(&png_bomb_header(0, 10), &ImageOptions::default()).is_err());
    // A BMP is a real image but not an accepted format.
    let mut bmp = b"BM".to_vec();
    bmp.extend_from_slice(&[0; 60]);
    assert!(matches!(
        image::preprocess(&bmp, &ImageOptions::default()),
        Err(ImageError::UnsupportedFormat)
    ));
}

#[test]
fn degenerate_geometry_is_an_error_not_a_panic() {
    // 20000×1 needs more than 36 crops, the aspect search picks 36×1 and the height scales to 0.
    let rgb = ::image::RgbImage::new(20_000, 1);
    assert!(matches!(
        image::preprocess_rgb(&rgb, 36),
        Err(ImageError::Degenerate { .. })
    ));
    assert!(matches!(
        image::preprocess_rgb(&::image::RgbImage::new(10, 10), 0),
        Err(ImageError::NoCrops)
    ));
    // A 1×1 image is fine (upscaled onto one crop).
    assert_eq!(
        image::preprocess_rgb(&::image::RgbImage::new(1, 1), 36)
            .unwrap()
            .num_crops(),
        2
    );
}

#[test]
fn user_typed_audio_placeholder_token_is_refused() {
    let prompt = Prompt::load(&switchyard_fixtures::fixture().join("model")).unwrap();
    let messages = vec![Message::text(
        Role::User,
        "Transcribe <|endoftext11|> please",
    )];
    let err = prompt.encode_messages(&messages, true).unwrap_err();
    assert!(
        matches!(&err, PromptError::ReservedToken { token, .. } if token == "<|endoftext11|>"),
        "{err}"
    );
}

#[test]
fn request_limits_name_the_limit() {
    let limits = Limits::default();
    assert!(limits.check_counts(16, 16).is_ok());
    let err = limits.check_counts(17, 0).unwrap_err();
    assert_eq!(err, LimitError::Images { got: 17, limit: 16 });
    assert!(err.to_string().contains("max_images"));
    assert!(limits
        .check_counts(0, 17)
        .unwrap_err()
        .to_string()
        .contains("max_audio_clips"));
    assert!(limits.check_audio_total(1800.0).is_ok());
    assert!(limits
        .check_audio_total(1800.5)
        .unwrap_err()
        .to_string()
        .contains("max_audio_seconds"));
}

#[test]
fn limits_deserialize_with_defaults() {
    let limits: Limits = serde_json::from_str(r#"{"max_images": 4}"#).unwrap();
    assert_eq!(
        limits,
        Limits {
            max_images: 4,
            ..Limits::default()
        }
    );
    assert!(serde_json::from_str::<Limits>(r#"{"max_imagez": 4}"#).is_err());
}

/// Reserved tokens of the fixture tokenizer with their ids.
fn reserved_tokens(p: &Prompt) -> Vec<(String, u32)> {
    let mut out: Vec<(String, u32)> = p
        .tokenizer()
        .get_added_tokens_decoder()
        .into_iter()
        .map(|(id, t)| (t.content, id))
        .collect();
    out.sort();
    assert!(out.len() >= 7, "{out:?}");
    out
}

fn text_parts(parts: &[&str]) -> Vec<ContentPart> {
    parts
        .iter()
        .map(|t| ContentPart::Text {
            text: (*t).to_owned(),
        })
        .collect()
}

/// The ids of a chat hold exactly the template's reserved ids: one role marker and one `<|end|>`
/// per message, then `<|assistant|>`; and the user text between them decodes back to itself.
fn assert_only_template_specials(p: &Prompt, messages: &[Message], what: &str) {
    let encoded = p
        .encode_messages(messages, true)
        .unwrap_or_else(|e| panic!("{what}: {e}"));
    let id = |t: &str| p.tokenizer().token_to_id(t).unwrap();
    let reserved: Vec<u32> = reserved_tokens(p).into_iter().map(|(_, id)| id).collect();
    let specials: Vec<u32> = encoded
        .ids
        .iter()
        .copied()
        .filter(|i| reserved.contains(i))
        .collect();
    let mut want = Vec::new();
    for m in messages {
        want.push(id(m.role.marker()));
        want.push(id("<|end|>"));
    }
    want.push(id("<|assistant|>"));
    assert_eq!(specials, want, "{what}: reserved ids {:?}", encoded.ids);
    // Between each marker and its <|end|>, the ids spell the message's joined text.
    let mut rest = &encoded.ids[..];
    for m in messages {
        let end = rest.iter().position(|&i| i == id("<|end|>")).unwrap();
        let joined: String = m
            .content
            .iter()
            .map(|part| match part {
                ContentPart::Text { text } => text.as_str(),
                _ => "",
            })
            .collect();
        let decoded = p.tokenizer().decode(&rest[1..end], false).unwrap();
        assert_eq!(decoded, joined, "{what}: text ids");
        rest = &rest[end + 1..];
    }
}

#[test]
fn a_reserved_token_split_across_text_parts_stays_text() {
    let p = Prompt::load(&switchyard_fixtures::fixture().join("model")).unwrap();
    let end_id = p.tokenizer().token_to_id("<|end|>").unwrap();
    // The case of issue 15: `<|en` + `d|>` joined by the template used to be `<|end|>`.
    let messages = vec![Message {
        role: Role::User,
        content: text_parts(&["hello <|en", "d|> there"]),
    }];
    let encoded = p.encode_messages(&messages, true).unwrap();
    assert_eq!(
        encoded.ids.iter().filter(|&&i| i == end_id).count(),
        1,
        "only the template's <|end|>: {:?}",
        encoded.ids
    );
    assert_eq!(
        encoded.text,
        "<|user|>hello <|end|> there<|end|><|assistant|>"
    );
    assert_only_template_specials(&p, &messages, "2 parts");
    let (_, tokenized) = p.tokenize_messages(&messages, true).unwrap();
    assert_eq!(tokenized, encoded.ids);

    // Every reserved token, split at every point into two parts, and into three.
    for (token, _) in reserved_tokens(&p) {
        let cuts: Vec<usize> = (1..token.len()).collect();
        for &i in &cuts {
            let (a, b) = token.split_at(i);
            for role in [Role::System, Role::User, Role::Assistant] {
                let messages = vec![Message {
                    role,
                    content: text_parts(&["x ", a, b, " y"]),
                }];
                assert_only_template_specials(&p, &messages, &format!("{token} at {i}"));
            }
            for &j in cuts.iter().filter(|&&j| j > i) {
                let messages = vec![Message {
                    role: Role::User,
                    content: text_parts(&[&token[..i], &token[i..j], &token[j..]]),
                }];
                assert_only_template_specials(&p, &messages, &format!("{token} at {i},{j}"));
            }
        }
    }
}

#[test]
fn a_reserved_token_split_across_messages_or_role_markers_stays_text() {
    let p = Prompt::load(&switchyard_fixtures::fixture().join("model")).unwrap();
    for (token, _) in reserved_tokens(&p) {
        for i in 1..token.len() {
            let (a, b) = token.split_at(i);
            // The end of one turn and the start of the next, around `<|end|><|user|>`.
            let messages = vec![
                Message::text(Role::System, format!("sys {a}")),
                Message::text(Role::User, b.to_owned()),
                Message::text(Role::Assistant, a.to_owned()),
                Message::text(Role::User, format!("{b} end")),
            ];
            assert_only_template_specials(&p, &messages, &format!("{token} at {i}"));
        }
        // Halves that complete a marker's own text: `<|user|>` + `|>`, `end|>` + `<|end|>`.
        for text in [
            "|>",
            "user|>",
            "<|",
            "<|end",
            "<|end|",
            "d|",
            "<|endoftext1",
        ] {
            let messages = vec![Message::text(Role::User, text)];
            assert_only_template_specials(&p, &messages, text);
        }
    }
    // Text next to a placeholder cannot join the placeholder token either.
    let messages = vec![Message {
        role: Role::User,
        content: vec![
            ContentPart::Text {
                text: "<|endoftext1".into(),
            },
            ContentPart::Text {
                text: "<|image_1|>".into(),
            },
            ContentPart::Text { text: "0|>".into() },
            ContentPart::Image { bytes: vec![0] },
        ],
    }];
    let encoded = p.encode_messages(&messages, true).unwrap();
    let image_id = p.special().image;
    assert_eq!(
        encoded.ids.iter().filter(|&&i| i == image_id).count(),
        1,
        "{:?}",
        encoded.ids
    );
}

#[test]
fn a_placeholder_split_across_parts_still_binds_on_the_joined_text() {
    // Placeholders are typed by users on purpose; the parts of a message are one text, so
    // `<|image_` + `1|>` is the placeholder of the message's image (no second one inserted).
    let p = Prompt::load(&switchyard_fixtures::fixture().join("model")).unwrap();
    let messages = vec![Message {
        role: Role::User,
        content: vec![
            ContentPart::Text {
                text: "see <|image_".into(),
            },
            ContentPart::Text {
                text: "1|> now".into(),
            },
            ContentPart::Image { bytes: vec![7] },
        ],
    }];
    let encoded = p.encode_messages(&messages, true).unwrap();
    assert_eq!(
        encoded.text,
        "<|user|>see <|image_1|> now<|end|><|assistant|>"
    );
    let image_id = p.special().image;
    assert_eq!(encoded.ids.iter().filter(|&&i| i == image_id).count(), 1);
    assert_eq!(encoded.images, vec![&[7u8][..]]);
}

#[test]
fn the_hand_written_flac_decodes() {
    let bytes = flac_constant(384_000, 48_000, 8, 8192, 8 * 48_000);
    assert!(bytes.len() < 200, "{} bytes", bytes.len());
    let decoded = audio::decode::decode(&bytes, 1e9).unwrap();
    assert_eq!(decoded.sample_rate, 384_000);
    assert_eq!(decoded.samples.len(), 384_000);
    assert!(decoded.samples.iter().all(|&s| s == 0.25));
    // With its length unstated it decodes the same.
    let unstated = audio::decode::decode(&flac_constant(384_000, 48_000, 8, 8192, 0), 1e9).unwrap();
    assert_eq!(unstated, decoded);
}

/// A FLAC that holds less than its header states (cut short, or frames that do not decode) is
/// refused, naming both counts, rather than served as a shorter clip.
#[test]
fn a_flac_short_of_its_stated_length_is_refused() {
    let whole = flac_constant(48_000, 4_800, 10, 100, 48_000);
    assert_eq!(
        audio::decode::decode(&whole, 1e9).unwrap().samples.len(),
        48_000
    );
    let states_more = flac_constant(48_000, 4_800, 10, 100, 96_000);
    let cut = &whole[..whole.len() / 2];
    for (what, bytes) in [("states more", &states_more[..]), ("cut", cut)] {
        let err = audio::decode::decode(bytes, 1e9).unwrap_err().to_string();
        assert!(err.contains("samples its header states"), "{what}: {err}");
        assert!(err.contains("of the "), "{what}: {err}");
    }
}

/// 384 kHz, one block of 48,000 samples per frame: 8 frames a second.
const BOMB_RATE: u32 = 384_000;
const BOMB_BLOCK: u16 = 48_000;

#[test]
fn a_384_khz_flac_declaring_a_huge_length_is_refused_from_its_header() {
    // 1000 s at 384 kHz is within max_audio_seconds (1800 s) but 384 million samples (3 GB as
    // f64), over max_audio_samples_per_clip. The stream holds a single frame, so the refusal can
    // only come from STREAMINFO: decoding would find 48,000 samples.
    let declared = 1000 * u64::from(BOMB_RATE);
    let bytes = flac_constant(BOMB_RATE, BOMB_BLOCK, 1, 0, declared);
    let err = audio::features_from_bytes(&bytes, &AudioOptions::default()).unwrap_err();
    assert!(
        matches!(
            err,
            AudioError::TooManySamples {
                got,
                rate: BOMB_RATE,
                limit: 86_400_000,
                which: SampleLimit::PerClip,
            } if got == declared
        ),
        "{err}"
    );
    assert!(
        err.to_string()
            .contains("max_audio_samples_per_clip = 86400000"),
        "{err}"
    );
    // The same clip stating its true length (one frame) is fine.
    let honest = flac_constant(BOMB_RATE, BOMB_BLOCK, 1, 0, u64::from(BOMB_BLOCK));
    let features = audio::features_from_bytes(&honest, &AudioOptions::default()).unwrap();
    assert_eq!(features.samples, u64::from(BOMB_BLOCK));
}

#[test]
fn a_flac_of_unstated_length_is_stopped_while_decoding() {
    // 20 s at 384 kHz (7.68 million samples) with no length in STREAMINFO.
    let bytes = flac_constant(BOMB_RATE, BOMB_BLOCK, 160, 0, 0);
    let options = AudioOptions {
        max_samples_per_clip: 1_000_000,
        ..AudioOptions::default()
    };
    let err = audio::features_from_bytes(&bytes, &options).unwrap_err();
    match err {
        // Stopped at the first packet that would pass the limit, before storing it.
        AudioError::TooManySamples {
            got,
            limit: 1_000_000,
            which: SampleLimit::PerClip,
            ..
        } => assert_eq!(got, 21 * u64::from(BOMB_BLOCK)),
        other => panic!("{other}"),
    }
    // A stated length that is smaller than what the stream holds does not help it.
    let lying = flac_constant(BOMB_RATE, BOMB_BLOCK, 160, 0, 48_000);
    assert!(matches!(
        audio::features_from_bytes(&lying, &options),
        Err(AudioError::TooManySamples { .. })
    ));
    // The duration limit is enforced the same way.
    let short = AudioOptions {
        max_seconds: 2.0,
        ..AudioOptions::default()
    };
    assert!(matches!(
        audio::features_from_bytes(&bytes, &short),
        Err(AudioError::TooLong { .. })
    ));
}

#[test]
fn wav_sample_limits_are_checked_from_the_header() {
    // 1 s at 48 kHz: 48,000 samples. The data is all there, so only the limit refuses it.
    let bytes = wav(spec(48_000, 2, 16, false), &vec![0i16; 96_000]);
    let options = AudioOptions {
        max_samples_per_clip: 47_999,
        ..AudioOptions::default()
    };
    let err = audio::features_from_bytes(&bytes, &options).unwrap_err();
    assert!(
        matches!(
            err,
            AudioError::TooManySamples {
                got: 48_000,
                rate: 48_000,
                limit: 47_999,
                which: SampleLimit::PerClip
            }
        ),
        "{err}"
    );
    assert!(
        err.to_string()
            .contains("max_audio_samples_per_clip = 47999"),
        "{err}"
    );
    // Decoded samples handed in directly meet the same limits.
    let err = audio::features_from_samples(&vec![0.0; 48_000], 48_000, &options).unwrap_err();
    assert!(matches!(err, AudioError::TooManySamples { .. }), "{err}");
    options_at_the_limit_pass(&bytes);
}

fn options_at_the_limit_pass(bytes: &[u8]) {
    let options = AudioOptions {
        max_samples_per_clip: 48_000,
        max_samples_per_request: 48_000,
        ..AudioOptions::default()
    };
    let features = audio::features_from_bytes(bytes, &options).unwrap();
    assert_eq!(features.samples, 48_000);
}

#[test]
fn the_request_sample_total_is_enforced_clip_by_clip() {
    let limits = Limits {
        max_audio_samples_per_request: 100_000,
        ..Limits::default()
    };
    let options = AudioOptions::from_limits(&limits);
    let one_second = wav(spec(48_000, 1, 16, false), &vec![0i16; 48_000]);
    // Two clips fit (96,000 samples).
    let two = audio::features_for_request(&[&one_second, &one_second], &options).unwrap();
    assert_eq!(two.len(), 2);
    assert_eq!(two.iter().map(|f| f.samples).sum::<u64>(), 96_000);
    // The third passes the total: refused from its header, naming the request limit.
    let err = audio::features_for_request(&[&one_second, &one_second, &one_second], &options)
        .unwrap_err();
    match &err {
        RequestAudioError::Clip {
            index: 2,
            cause:
                AudioError::TooManySamples {
                    got: 144_000,
                    limit: 100_000,
                    which: SampleLimit::PerRequest,
                    ..
                },
        } => {}
        other => panic!("{other}"),
    }
    assert!(
        err.to_string()
            .contains("max_audio_samples_per_request = 100000"),
        "{err}"
    );
    // A FLAC of unstated length after them is stopped while decoding, at the request's bound.
    let flac = flac_constant(48_000, 4_000, 100, 0, 0);
    let err =
        audio::features_for_request(&[&one_second, &one_second, &flac], &options).unwrap_err();
    match err {
        RequestAudioError::Clip {
            index: 2,
            cause:
                AudioError::TooManySamples {
                    got,
                    which: SampleLimit::PerRequest,
                    ..
                },
        } => assert_eq!(got, 96_000 + 8_000),
        other => panic!("{other}"),
    }
    // The summed duration is checked after each clip (here 3 s against 2.5 s).
    let short = AudioOptions {
        max_seconds: 2.5,
        ..AudioOptions::default()
    };
    let err =
        audio::features_for_request(&[&one_second, &one_second, &one_second], &short).unwrap_err();
    assert!(
        matches!(
            err,
            RequestAudioError::Limit(LimitError::AudioSeconds { .. })
        ),
        "{err}"
    );
    // The plain check for callers that decode clips themselves.
    assert!(limits.check_audio_samples_total(100_000).is_ok());
    let err = limits.check_audio_samples_total(100_001).unwrap_err();
    assert_eq!(
        err,
        LimitError::AudioSamples {
            got: 100_001,
            limit: 100_000
        }
    );
    assert!(err
        .to_string()
        .contains("max_audio_samples_per_request = 100000"));
}

#[test]
fn odd_sample_rates_are_refused_by_the_resampler_cost_limit() {
    for (rate, taps) in [
        (44_101, 882_021),
        (383_999, 7_679_981),
        (8_001, 320_001),
        (47_952, 59_941),
    ] {
        let bytes = wav(spec(rate, 1, 16, false), &vec![0i16; 8_000]);
        let start = std::time::Instant::now();
        let err = audio::features_from_bytes(&bytes, &AudioOptions::default());
        let elapsed = start.elapsed();
        if taps <= 200_000 {
            // Within the default limit: resampled with its (bounded) filter.
            let features = err.unwrap_or_else(|e| panic!("{rate}: {e}"));
            assert!(features.frames > 0);
            continue;
        }
        let err = err.unwrap_err();
        assert!(
            matches!(err, AudioError::ResampleCost { rate: r, taps: t, limit: 200_000 } if r == rate && t == taps),
            "{rate}: {err}"
        );
        assert!(
            err.to_string()
                .contains("max_resample_filter_taps = 200000"),
            "{err}"
        );
        // Refused from the header's rate, before decoding or designing anything.
        assert!(elapsed < std::time::Duration::from_secs(1), "{elapsed:?}");
        // The same from decoded samples, and from a FLAC header.
        assert!(matches!(
            audio::features_from_samples(&vec![0.0; 8_000], rate, &AudioOptions::default()),
            Err(AudioError::ResampleCost { .. })
        ));
    }
    let flac = flac_constant(44_101, 4_410, 2, 0, 0);
    assert!(matches!(
        audio::features_from_bytes(&flac, &AudioOptions::default()),
        Err(AudioError::ResampleCost { rate: 44_101, .. })
    ));
    // Reference mode decimates 44,101 Hz by 2 (41 taps), so the limit does not refuse it.
    let reference = AudioOptions {
        resample: ResampleMode::Reference,
        ..AudioOptions::default()
    };
    let bytes = wav(spec(44_101, 1, 16, false), &vec![0i16; 8_000]);
    assert!(audio::features_from_bytes(&bytes, &reference).is_ok());
    // Raising the limit resamples the odd rate.
    let raised = AudioOptions {
        max_filter_taps: 1_000_000,
        ..AudioOptions::default()
    };
    let features = audio::features_from_bytes(&bytes, &raised).unwrap();
    // 8,000 samples at 44,101 Hz are 2,903 at 16 kHz: (2903 − 400) // 160 + 1 = 16 frames.
    assert_eq!(features.frames, 16);
}

#[test]
fn new_limits_deserialize_and_default() {
    let limits = Limits::default();
    assert_eq!(limits.max_audio_samples_per_clip, 86_400_000);
    assert_eq!(limits.max_audio_samples_per_request, 86_400_000);
    assert_eq!(limits.max_resample_filter_taps, 200_000);
    let parsed: Limits = serde_json::from_str(
        r#"{"max_audio_samples_per_clip": 5, "max_audio_samples_per_request": 6, "max_resample_filter_taps": 7}"#,
    )
    .unwrap();
    let options = AudioOptions::from_limits(&parsed);
    assert_eq!(
        (
            options.max_samples_per_clip,
            options.max_samples_per_request,
            options.request_samples_used,
            options.max_filter_taps
        ),
        (5, 6, 0, 7)
    );
}

/// Set in the child process that [`audio_bombs_keep_peak_memory_bounded`] re-executes this test
/// binary as, to the case it should measure.
#[cfg(target_os = "linux")]
const MEMORY_CHILD: &str = "SWITCHYARD_FRONTEND_MEMORY_CHILD";

/// A field of /proc/self/status, in kB.
#[cfg(target_os = "linux")]
fn proc_status_kb(field: &str) -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let line = status
        .lines()
        .find(|l| l.starts_with(field))
        .unwrap_or_else(|| panic!("no {field} in /proc/self/status"));
    line[field.len()..]
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .unwrap()
}

/// In the child: decode one 384 kHz bomb and print how far the peak RSS rose above the RSS before
/// decoding (VmHWM − VmRSS before, so freed memory below an earlier peak cannot hide growth).
#[cfg(target_os = "linux")]
fn memory_child(case: &str) {
    // 20 s of 384 kHz silence: 7.68 million samples, 61 MB as f64, in about 2.5 kB of FLAC.
    let stated = flac_constant(BOMB_RATE, BOMB_BLOCK, 160, 0, 1000 * u64::from(BOMB_RATE));
    let unstated = flac_constant(BOMB_RATE, BOMB_BLOCK, 160, 0, 0);
    let before = proc_status_kb("VmRSS:");
    match case {
        // Default limits: the 1000 s it states are refused from STREAMINFO.
        "stated" => {
            let err = audio::features_from_bytes(&stated, &AudioOptions::default()).unwrap_err();
            assert!(matches!(err, AudioError::TooManySamples { .. }), "{err}");
        }
        // No stated length: stopped after 1 million samples.
        "unstated" => {
            let options = AudioOptions {
                max_samples_per_clip: 1_000_000,
                ..AudioOptions::default()
            };
            let err = audio::features_from_bytes(&unstated, &options).unwrap_err();
            assert!(matches!(err, AudioError::TooManySamples { .. }), "{err}");
        }
        // The old bound (seconds × the clip's own rate only): the clip is materialised. This
        // shows the probe sees what the bounded cases must not do.
        "unbounded" => {
            let options = AudioOptions {
                max_samples_per_clip: u64::MAX,
                max_samples_per_request: u64::MAX,
                ..AudioOptions::default()
            };
            let decoded = audio::decode::decode_with(&unstated, &options).unwrap();
            assert_eq!(decoded.samples.len(), 160 * usize::from(BOMB_BLOCK));
        }
        other => panic!("unknown case {other}"),
    }
    let peak = proc_status_kb("VmHWM:");
    println!("PEAK_GROWTH_KB={}", peak.saturating_sub(before));
}

/// Re-runs this test binary on `test` alone with `var` set to `case`, and reads the peak memory
/// growth the child prints (`PEAK_GROWTH_KB=`), in MB: each case in a fresh process, so no other
/// test's allocations blur the peak.
#[cfg(target_os = "linux")]
fn peak_growth_mb_in_child(test: &str, var: &str, case: &str) -> f64 {
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            &format!("hostile::{test}"),
            "--nocapture",
            "--test-threads=1",
        ])
        .env(var, case)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{case}: child failed\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let kb: u64 = stdout
        .lines()
        // The harness prints the test's name on the same line.
        .find_map(|l| l.split_once("PEAK_GROWTH_KB=").map(|(_, kb)| kb))
        .unwrap_or_else(|| panic!("{case}: no measurement in\n{stdout}"))
        .trim()
        .parse()
        .unwrap();
    kb as f64 / 1024.0
}

/// Issue 15's acceptance case: a 384 kHz FLAC of silence is refused before its samples are
/// materialised, and peak memory stays under a bound. Each case runs in a fresh process (this
/// test binary re-executed on this test alone) so no other test's allocations blur the peak.
#[cfg(target_os = "linux")]
#[test]
fn audio_bombs_keep_peak_memory_bounded() {
    if let Ok(case) = std::env::var(MEMORY_CHILD) {
        memory_child(&case);
        return;
    }
    let growth_mb = |case: &str| {
        peak_growth_mb_in_child("audio_bombs_keep_peak_memory_bounded", MEMORY_CHILD, case)
    };
    const BOUND_MB: f64 = 24.0;
    let stated = growth_mb("stated");
    let unstated = growth_mb("unstated");
    let unbounded = growth_mb("unbounded");
    eprintln!("peak growth: stated {stated:.1} MB, unstated {unstated:.1} MB, unbounded {unbounded:.1} MB");
    // Refused from the header: next to nothing. Stopped while decoding: at most the 1 million
    // samples allowed (8 MB) plus decoder buffers.
    assert!(stated < BOUND_MB, "stated length: {stated:.1} MB");
    assert!(unstated < BOUND_MB, "unstated length: {unstated:.1} MB");
    // The probe does see a materialised clip (61 MB of samples).
    assert!(
        unbounded > 2.0 * BOUND_MB,
        "unbounded decode grew only {unbounded:.1} MB"
    );
}

/// Set in the child process that [`metadata_bombs_are_refused_within_a_small_address_space`]
/// re-executes this test binary as: `guarded:<clip>` or `symphonia:<clip>`.
#[cfg(target_os = "linux")]
const ADDRESS_SPACE_CHILD: &str = "SWITCHYARD_FRONTEND_ADDRESS_SPACE_CHILD";

/// symphonia alone on `clip`, without the front end's guard: the probe (which reads the
/// metadata), then the decoder (which reads the codec's setup).
#[cfg(target_os = "linux")]
fn symphonia_unguarded(clip: &[u8]) {
    use symphonia::core::io::MediaSourceStream;
    let source = MediaSourceStream::new(
        Box::new(std::io::Cursor::new(clip.to_vec())),
        Default::default(),
    );
    let probe = symphonia::default::get_probe();
    let hint = symphonia::core::probe::Hint::new();
    if let Ok(probed) = probe.format(&hint, source, &Default::default(), &Default::default()) {
        if let Some(track) = probed.format.tracks().first() {
            let codecs = symphonia::default::get_codecs();
            let _ = codecs.make(&track.codec_params, &Default::default());
        }
    }
}

/// Clips whose metadata states sizes symphonia allocates before reading or checking them: each
/// must be refused without the allocation. Overcommitted memory hides a 4 GiB request (no page is
/// touched), so each clip is decoded in a child process whose address space is capped at 1 GiB
/// (`ulimit -v`), where such an allocation aborts the process. The same clip given to symphonia
/// directly does abort there: the cap shows what the guard prevents.
#[cfg(target_os = "linux")]
#[test]
fn metadata_bombs_are_refused_within_a_small_address_space() {
    use switchyard_fixtures::crafted::{id3v2_tag, ogg_vorbis_codebook_bomb};
    let mut picture = flac_constant(44_100, 4096, 1, 0, 4096);
    // A PICTURE block after STREAMINFO, stating a 4 GiB media type.
    picture.truncate(4 + 4 + 34);
    picture[4] &= 0x7f; // STREAMINFO is no longer the last block
    picture.extend_from_slice(&[0x86, 0, 0, 12]);
    picture.extend_from_slice(&3u32.to_be_bytes());
    picture.extend_from_slice(&0xffff_fff0u32.to_be_bytes());
    picture.extend_from_slice(b"png\0");
    // A WAV whose first chunk (before `fmt `) states 4 GiB: hound skips it in 1 KiB reads.
    let mut wav_chunk = b"RIFF\xff\xff\xff\xffWAVELIST\xf0\xff\xff\xff".to_vec();
    wav_chunk.extend(wav_header(16_000, 1, 16, 1, 4)[12..].iter());
    // An Ogg page whose segment table states 255 segments of 255 bytes, none of them there.
    let mut ogg_page = b"OggS\0\x02".to_vec();
    ogg_page.extend_from_slice(&[0; 20]);
    ogg_page.push(255);
    ogg_page.extend_from_slice(&[255; 255]);
    // The last field: whether symphonia alone is the control (it reads no WAV here).
    let clips: [(&str, Vec<u8>, bool); 5] = [
        ("id3v2 title of 4 GiB", id3v2_tag(0xffff_fff0), true),
        ("flac picture of 4 GiB", picture, true),
        // 16.7 million entries × 31 dimensions: a 2 GB lookup table.
        (
            "vorbis codebook of 2 GB",
            ogg_vorbis_codebook_bomb(0xff_ffff, 31),
            true,
        ),
        ("wav chunk of 4 GiB", wav_chunk, false),
        ("ogg page past the clip", ogg_page, false),
    ];
    if let Ok(case) = std::env::var(ADDRESS_SPACE_CHILD) {
        let (how, name) = case.split_once(':').unwrap();
        let (_, clip, _) = clips.iter().find(|(n, _, _)| *n == name).unwrap();
        if how == "symphonia" {
            symphonia_unguarded(clip);
            println!("SURVIVED");
        } else {
            let err = audio::features_from_bytes(clip, &AudioOptions::default()).unwrap_err();
            println!("REFUSED: {err}");
        }
        return;
    }
    let child = |case: String| {
        std::process::Command::new("sh")
            .arg("-c")
            .arg("ulimit -v 1048576 && exec \"$@\"")
            .arg("sh")
            .arg(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "hostile::metadata_bombs_are_refused_within_a_small_address_space",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(ADDRESS_SPACE_CHILD, case)
            .output()
            .unwrap()
    };
    for (name, _, has_control) in &clips {
        let out = child(format!("guarded:{name}"));
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success() && stdout.contains("REFUSED: "),
            "{name}: {:?}\n{stdout}\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        eprintln!(
            "{name}: {}",
            stdout.lines().find(|l| l.contains("REFUSED")).unwrap()
        );
        if !has_control {
            continue;
        }
        let control = child(format!("symphonia:{name}"));
        assert!(
            !control.status.success()
                && !String::from_utf8_lossy(&control.stdout).contains("SURVIVED"),
            "{name}: symphonia alone survived the 1 GiB cap, so the cap shows nothing"
        );
    }
    // Stating what it holds, the same tag is no ID3v2 error.
    let honest = audio::features_from_bytes(&id3v2_tag(8), &AudioOptions::default());
    assert!(
        !matches!(&honest, Err(AudioError::Decode(m)) if m.contains("ID3v2")),
        "{honest:?}"
    );
}

/// Set in the child process that [`an_icc_profile_bomb_is_not_inflated_by_the_header_probe`]
/// re-executes this test binary as: `probe`, `decode` or `decoder`.
#[cfg(target_os = "linux")]
const ICCP_CHILD: &str = "SWITCHYARD_FRONTEND_ICCP_CHILD";

/// The dimensions of a PNG are read from its IHDR chunk: the PNG decoder's own header read
/// inflates every chunk before the image data, an ICC profile included, so a 300 kB image whose
/// profile inflates to 256 MB cost that much before any limit of ours was checked (and without
/// the `image` crate's allocation limit, as a review of a change here found, without bound).
/// Decoding the image does not inflate it either: the decoder took the profile whole, bounded
/// only by the allocation limit sized for the pixels (QA: 540 MB for a 10 × 1 PNG of 522 kB).
/// Each case runs in a fresh process, as the audio bombs do.
#[cfg(target_os = "linux")]
#[test]
fn an_icc_profile_bomb_is_not_inflated_by_the_header_probe() {
    const INFLATED: usize = 256 << 20;
    if let Ok(case) = std::env::var(ICCP_CHILD) {
        let png = png_iccp_bomb(INFLATED);
        let before = proc_status_kb("VmRSS:");
        match case.as_str() {
            "probe" => {
                assert_eq!(
                    image::decode::probe(&png, &ImageOptions::default()).unwrap(),
                    (1, 1)
                );
            }
            "decode" => {
                let rgb = image::decode::decode_rgb(&png, &ImageOptions::default()).unwrap();
                assert_eq!(
                    (rgb.dimensions(), rgb.as_raw().as_slice()),
                    ((1, 1), &[0u8; 3][..])
                );
            }
            // What the probe must not do: the decoder's header read, unbounded.
            "decoder" => {
                let mut reader = ::image::ImageReader::with_format(
                    std::io::Cursor::new(&png),
                    ::image::ImageFormat::Png,
                );
                reader.no_limits();
                assert_eq!(reader.into_dimensions().unwrap(), (1, 1));
            }
            other => panic!("unknown case {other}"),
        }
        let peak = proc_status_kb("VmHWM:");
        println!("PEAK_GROWTH_KB={}", peak.saturating_sub(before));
        return;
    }
    let growth_mb = |case: &str| {
        peak_growth_mb_in_child(
            "an_icc_profile_bomb_is_not_inflated_by_the_header_probe",
            ICCP_CHILD,
            case,
        )
    };
    let probe = growth_mb("probe");
    let decode = growth_mb("decode");
    let decoder = growth_mb("decoder");
    eprintln!(
        "peak growth: probe {probe:.1} MB, decode {decode:.1} MB, the decoder's header read \
         {decoder:.1} MB"
    );
    assert!(probe < 8.0, "the probe grew {probe:.1} MB");
    assert!(decode < 8.0, "decoding grew {decode:.1} MB");
    assert!(
        decoder > 128.0,
        "the decoder's header read grew only {decoder:.1} MB"
    );
}

/// A WebP whose VP8X canvas is 2^24 × 2^24 pixels (the format's most) in 30 bytes: refused
/// naming `max_image_pixels`, as a PNG or JPEG header of that size is.
#[test]
fn a_webp_canvas_bomb_names_the_pixel_limit() {
    let mut chunk = b"VP8X".to_vec();
    chunk.extend(10u32.to_le_bytes());
    chunk.extend([0, 0, 0, 0]); // flags, reserved
    chunk.extend([0xff, 0xff, 0xff, 0xff, 0xff, 0xff]); // width − 1, height − 1 (24 bits each)
    let mut webp = b"RIFF".to_vec();
    webp.extend((4 + chunk.len() as u32).to_le_bytes());
    webp.extend(b"WEBP");
    webp.extend(chunk);
    let err = image::decode::probe(&webp, &ImageOptions::default()).unwrap_err();
    assert!(err.to_string().contains("max_image_pixels"), "{err}");
    let err = image::decode::decode_rgb(&webp, &ImageOptions::default()).unwrap_err();
    assert!(err.to_string().contains("max_image_pixels"), "{err}");
}

/// A 16 × 16 GIF whose one frame states 65535 × 65535 pixels: the screen size passes the pixel
/// limit, the frame does not, and the refusal names the limit.
#[test]
fn a_gif_frame_larger_than_its_screen_names_the_pixel_limit() {
    let mut gif = b"GIF89a".to_vec();
    gif.extend([16, 0, 16, 0, 0, 0, 0]); // screen 16 x 16, no global colour table
    gif.extend([0x2c, 0, 0, 0, 0, 0xff, 0xff, 0xff, 0xff, 0x80]); // frame 65535², local table
    gif.extend([0, 0, 0, 255, 255, 255]); // two colours
    gif.extend([2, 2, 0x4c, 0x01, 0, 0x3b]); // LZW data, end of image, trailer
    let err = image::decode::decode_rgb(&gif, &ImageOptions::default()).unwrap_err();
    assert!(err.to_string().contains("max_image_pixels"), "{err}");
}

/// A JPEG cut short is refused as truncated (the decoder would fill the rest with grey); the
/// whole file decodes, also with bytes after its end.
#[test]
fn a_truncated_jpeg_is_refused() {
    let pixels: Vec<u8> = (0..48 * 32 * 3).map(|i| (i * 7 % 251) as u8).collect();
    let mut jpeg = Vec::new();
    ::image::codecs::jpeg::JpegEncoder::new_with_quality(&mut jpeg, 90)
        .encode(&pixels, 48, 32, ::image::ExtendedColorType::Rgb8)
        .unwrap();
    let options = ImageOptions::default();
    assert_eq!(
        image::decode::decode_rgb(&jpeg, &options)
            .unwrap()
            .dimensions(),
        (48, 32)
    );
    // Whatever follows the image is not read: text, or binary data holding markers (a motion
    // photo's video), whose last one is a start of scan.
    for trailer in [
        &b"trailing bytes after the image"[..],
        &[0xff, 0xd9, 1, 0xff, 0xda, 0, 9],
    ] {
        let mut followed = jpeg.clone();
        followed.extend(trailer);
        assert!(
            image::decode::decode_rgb(&followed, &options).is_ok(),
            "{trailer:?}"
        );
    }
    // Cut inside its header: the header read refuses it.
    assert!(image::decode::decode_rgb(&jpeg[..jpeg.len() / 10], &options).is_err());
    for cut in [jpeg.len() * 3 / 4, jpeg.len() - 2] {
        let err = image::decode::decode_rgb(&jpeg[..cut], &options).unwrap_err();
        assert!(err.to_string().contains("truncated"), "{cut}: {err}");
    }
}
