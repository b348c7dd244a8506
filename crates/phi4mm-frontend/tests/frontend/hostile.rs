//! Malformed, truncated and hostile inputs: each gives a typed error, never a panic or an
//! allocation sized from an attacker's header.

use std::io::Cursor;
use switchyard_phi4mm_frontend::audio::{self, AudioError, AudioOptions};
use switchyard_phi4mm_frontend::image::{self, ImageError, ImageOptions};
use switchyard_phi4mm_frontend::limits::{LimitError, Limits};
use switchyard_phi4mm_frontend::prompt::{ContentPart, Message, Prompt, PromptError, Role};

fn wav_header(rate: u32, channels: u16, bits: u16, format_tag: u16, data_len: u32) -> Vec<u8> {
    let block = channels * bits / 8;
    let mut h = Vec::new();
    h.extend_from_slice(b"RIFF");
    h.extend_from_slice(&data_len.wrapping_add(36).to_le_bytes());
    h.extend_from_slice(b"WAVEfmt ");
    h.extend_from_slice(&16u32.to_le_bytes());
    h.extend_from_slice(&format_tag.to_le_bytes());
    h.extend_from_slice(&channels.to_le_bytes());
    h.extend_from_slice(&rate.to_le_bytes());
    h.extend_from_slice(&(rate * u32::from(block)).to_le_bytes());
    h.extend_from_slice(&block.to_le_bytes());
    h.extend_from_slice(&bits.to_le_bytes());
    h.extend_from_slice(b"data");
    h.extend_from_slice(&data_len.to_le_bytes());
    h
}

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
    assert!(matches!(err, AudioError::Decode(_)), "{err}");
    // A RIFF/WAVE with an A-law format tag is refused as unsupported, not misread.
    let mut alaw = wav_header(8000, 1, 8, 6, 1000);
    alaw.extend_from_slice(&[0; 1000]);
    assert!(audio::features_from_bytes(&alaw, &AudioOptions::default()).is_err());
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

/// A PNG whose IHDR claims 100000×100000 (10^10 pixels, 30 GB of RGB).
fn png_bomb_header(width: u32, height: u32) -> Vec<u8> {
    fn crc32(data: &[u8]) -> u32 {
        let mut crc = 0xFFFF_FFFFu32;
        for &b in data {
            crc ^= u32::from(b);
            for _ in 0..8 {
                crc = if crc & 1 != 0 {
                    (crc >> 1) ^ 0xEDB8_8320
                } else {
                    crc >> 1
                };
            }
        }
        !crc
    }
    let chunk = |kind: &[u8], data: &[u8]| {
        let mut c = (data.len() as u32).to_be_bytes().to_vec();
        let mut body = kind.to_vec();
        body.extend_from_slice(data);
        c.extend_from_slice(&body);
        c.extend_from_slice(&crc32(&body).to_be_bytes());
        c
    };
    let mut ihdr = Vec::new();
    ihdr.extend_from_slice(&width.to_be_bytes());
    ihdr.extend_from_slice(&height.to_be_bytes());
    ihdr.extend_from_slice(&[8, 2, 0, 0, 0]); // 8-bit RGB
    let mut png = b"\x89PNG\r\n\x1a\n".to_vec();
    png.extend(chunk(b"IHDR", &ihdr));
    png.extend(chunk(
        b"IDAT",
        &[0x78, 0x9c, 0x03, 0x00, 0x00, 0x00, 0x00, 0x01],
    ));
    png.extend(chunk(b"IEND", &[]));
    png
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
        for text in ["|>", "user|>", "<|", "<|end", "<|end|", "d|", "<|endoftext1"] {
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
    assert_eq!(encoded.text, "<|user|>see <|image_1|> now<|end|><|assistant|>");
    let image_id = p.special().image;
    assert_eq!(encoded.ids.iter().filter(|&&i| i == image_id).count(), 1);
    assert_eq!(encoded.images, vec![&[7u8][..]]);
}
