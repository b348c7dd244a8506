//! Audio front end against the phi4mm-tiny fixture (`audio_features.safetensors`, manifest
//! `audio_features.cases`), plus the reference-mode quirks of docs/phi4mm-model.md §6.2.

use switchyard_fixtures::{max_abs_diff, Tensors};
use switchyard_phi4mm_frontend::audio::{self, AudioOptions, ResampleMode};

const TOL: f32 = 1e-4;

fn check_case(case: &str, mode: ResampleMode) {
    let manifest = switchyard_fixtures::manifest();
    let entry = &manifest["audio_features"]["cases"][case];
    let wav = switchyard_fixtures::read(entry["wav"].as_str().unwrap());
    let options = AudioOptions {
        resample: mode,
        ..AudioOptions::default()
    };
    let got = audio::features_from_bytes(&wav, &options).unwrap_or_else(|e| panic!("{case}: {e}"));
    // The header alone gives the same frame count (what admission charges).
    let header = audio::probe(&wav, &options).unwrap_or_else(|e| panic!("{case}: {e}"));
    assert_eq!(
        audio::feature_frames(header.frames.unwrap(), header.sample_rate, mode),
        got.frames,
        "{case}: frames from the header"
    );
    let tensors = Tensors::open("audio_features.safetensors");
    let (want, shape) = tensors.f32(&format!("{case}.input_audio_embeds"));
    let (sizes, _) = tensors.i64(&format!("{case}.audio_embed_sizes"));
    assert_eq!(shape, vec![1, got.frames, 80], "{case}: frames");
    assert_eq!(
        got.frames as u64,
        entry["num_frames"].as_u64().unwrap(),
        "{case}: manifest frames"
    );
    assert_eq!(got.num_tokens as i64, sizes[0], "{case}: audio tokens");
    let diff = max_abs_diff(&got.features, &want);
    eprintln!(
        "{case}: frames {} tokens {} max abs diff {diff:e}",
        got.frames, got.num_tokens
    );
    assert!(diff <= TOL, "{case}: max abs diff {diff} > {TOL}");
}

#[test]
fn audio_16k_polyphase() {
    check_case("audio_16k", ResampleMode::Polyphase);
}

#[test]
fn audio_16k_reference_mode_is_the_same() {
    check_case("audio_16k", ResampleMode::Reference);
}

#[test]
fn audio_8k_polyphase() {
    check_case("audio_8k", ResampleMode::Polyphase);
}

#[test]
fn audio_44k_polyphase() {
    check_case("audio_44k", ResampleMode::Polyphase);
}

#[test]
fn audio_long_16k() {
    check_case("audio_long_16k", ResampleMode::Polyphase);
}

#[test]
fn audio_44k_reference() {
    check_case("audio_44k_reference", ResampleMode::Reference);
}

#[test]
fn audio_8k_reference() {
    check_case("audio_8k_reference", ResampleMode::Reference);
}

/// The resampled waveforms themselves (`waveform_16k`, `waveform_effective`) match SciPy.
#[test]
fn resampled_waveforms_match_scipy() {
    let tensors = Tensors::open("audio_features.safetensors");
    for (case, wav, up, down) in [
        ("audio_8k.waveform_16k", "inputs/audio_8k.wav", 2, 1),
        ("audio_44k.waveform_16k", "inputs/audio_44k.wav", 160, 441),
        (
            "audio_44k_reference.waveform_effective",
            "inputs/audio_44k.wav",
            1,
            2,
        ),
    ] {
        let decoded = audio::decode::decode(&switchyard_fixtures::read(wav), 1e9).unwrap();
        let got: Vec<f32> = audio::resample::resample_poly(&decoded.samples, up, down)
            .into_iter()
            .map(|x| x as f32)
            .collect();
        let (want, _) = tensors.f32(case);
        let diff = max_abs_diff(&got, &want);
        eprintln!("{case}: max abs diff {diff:e}");
        assert!(diff <= 1e-6, "{case}: {diff}");
    }
}

#[test]
fn mel_bank_equals_fixture_bit_for_bit() {
    let (want, shape) = Tensors::open("audio_features.safetensors").f32("mel_filters");
    assert_eq!(shape, vec![257, 80]);
    assert_eq!(audio::mel::bank().weights, want);
}

/// docs/phi4mm-model.md §6.2: 24 kHz → `fs // 16000 = 1`, no resampling, relabelled 16 kHz:
/// 24,000 samples give (24000 − 400) // 160 + 1 = 148 frames.
#[test]
fn reference_mode_24khz_quirk_gives_148_frames() {
    let samples: Vec<f64> = (0..24_000).map(|i| (i as f64 * 0.01).sin() * 0.1).collect();
    let options = AudioOptions {
        resample: ResampleMode::Reference,
        ..AudioOptions::default()
    };
    let got = audio::features_from_samples(&samples, 24_000, &options).unwrap();
    assert_eq!(got.frames, 148);
    assert_eq!(got.num_tokens, 19);
    // The polyphase mode resamples properly: 16,000 samples → 98 frames.
    let proper = audio::features_from_samples(&samples, 24_000, &AudioOptions::default()).unwrap();
    assert_eq!(proper.frames, 98);
}

/// docs/phi4mm-model.md §6.6 worked examples: frames and tokens for 16 kHz lengths.
#[test]
fn token_counts_of_section_4_5() {
    for (samples, frames, tokens) in [
        (56_400, 351, 44),
        (56_559, 351, 44),
        (16_000, 98, 13),
        (160_000, 998, 125),
        (480_000, 2998, 375),
    ] {
        let x = vec![0.0; samples];
        let got = audio::features_from_samples(&x, 16_000, &AudioOptions::default()).unwrap();
        assert_eq!(
            (got.frames, got.num_tokens),
            (frames, tokens),
            "{samples} samples"
        );
    }
}

/// A WAV written to a pipe leaves 0xFFFFFFFF as its RIFF and data lengths ("to the end of the
/// file"): it reads as the file with its lengths stated, as `soundfile` reads it, down to whole
/// sample frames (a stray byte at the end is no frame).
#[test]
fn a_streamed_wav_reads_to_the_end_of_its_bytes() {
    let manifest = switchyard_fixtures::manifest();
    // ffmpeg's marker, and SoX's.
    for (case, marker) in [("audio_16k", u32::MAX), ("audio_44k", 0x7FFF_F000)] {
        let entry = &manifest["audio_features"]["cases"][case];
        let wav = switchyard_fixtures::read(entry["wav"].as_str().unwrap());
        let mut streamed = wav.clone();
        streamed[4..8].copy_from_slice(&marker.wrapping_add(36).to_le_bytes());
        let mut at = 12;
        loop {
            let size = u32::from_le_bytes(streamed[at + 4..at + 8].try_into().unwrap()) as usize;
            if &streamed[at..at + 4] == b"data" {
                assert_eq!(
                    at + 8 + size,
                    wav.len(),
                    "{case}: the data chunk ends the file"
                );
                streamed[at + 4..at + 8].copy_from_slice(&marker.to_le_bytes());
                break;
            }
            at += 8 + size + (size & 1);
        }
        streamed.push(0x7f);
        let options = AudioOptions::default();
        let stated = audio::features_from_bytes(&wav, &options).unwrap();
        let got = audio::features_from_bytes(&streamed, &options)
            .unwrap_or_else(|e| panic!("{case}: {e}"));
        assert_eq!(got, stated, "{case}");
        assert_eq!(
            audio::probe(&streamed, &options).unwrap(),
            audio::probe(&wav, &options).unwrap(),
            "{case}"
        );
    }
}

/// A chunk of odd length before the samples is followed by a pad byte (RIFF pads every chunk
/// to an even length): the clip reads as it does without that chunk.
#[test]
fn a_wav_with_an_odd_length_chunk_reads_past_its_pad_byte() {
    let manifest = switchyard_fixtures::manifest();
    let entry = &manifest["audio_features"]["cases"]["audio_16k"];
    let wav = switchyard_fixtures::read(entry["wav"].as_str().unwrap());
    let mut at = 12;
    while &wav[at..at + 4] != b"data" {
        let size = u32::from_le_bytes(wav[at + 4..at + 8].try_into().unwrap()) as usize;
        at += 8 + size + (size & 1);
    }
    let mut padded = wav[..at].to_vec();
    padded.extend_from_slice(b"junk");
    padded.extend_from_slice(&3u32.to_le_bytes());
    padded.extend_from_slice(b"abc\0");
    padded.extend_from_slice(&wav[at..]);
    let riff = (padded.len() - 8) as u32;
    padded[4..8].copy_from_slice(&riff.to_le_bytes());
    let options = AudioOptions::default();
    let got = audio::features_from_bytes(&padded, &options).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(got, audio::features_from_bytes(&wav, &options).unwrap());
    assert_eq!(
        audio::probe(&padded, &options).unwrap(),
        audio::probe(&wav, &options).unwrap()
    );
}
