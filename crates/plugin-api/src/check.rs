//! Checking a model's settings without creating the model (API 2.2), for `switchyard config
//! check`: a config's settings reach the plugin that owns them before any weights are loaded.
//!
//! The check is an optional plain C symbol, [`CHECK_SETTINGS_SYMBOL`], looked up with
//! `libloading` like the manifest, and not a field of the root module: abi_stable refuses a
//! library whose root module has fewer fields than the host's, so a new field would lock every
//! older 2.x plugin out (see `docs/plugin-abi.md`). A plugin that predates 2.2, or that exports
//! no check, simply lacks the symbol, and its settings are checked when an instance is created.
//!
//! Its C signature is [`CheckSettingsFn`]: the model kind, the settings as JSON text and the
//! directory that relative paths in them start from (the host config's), each NUL-terminated
//! UTF-8. It answers null when the settings are accepted, or else the refusal's message:
//! NUL-terminated UTF-8 owned by the plugin, valid until the next call on the same thread.

use crate::{error::PluginError, services::SettingsText};
use std::{
    cell::RefCell,
    ffi::{c_char, CStr, CString},
    panic::{catch_unwind, AssertUnwindSafe},
    path::Path,
};

/// The optional symbol through which a plugin checks a model's settings (see the module docs).
pub const CHECK_SETTINGS_SYMBOL: &str = "switchyard_plugin_check_settings";

/// The symbol's type: `(kind, settings_json, config_dir) -> refusal or null`.
pub type CheckSettingsFn =
    unsafe extern "C" fn(*const c_char, *const c_char, *const c_char) -> *const c_char;

thread_local! {
    /// The last refusal made on this thread: the memory the returned pointer points into.
    static REFUSAL: RefCell<CString> = RefCell::new(CString::default());
}

/// The symbol's body for [`crate::export_plugin!`]: reads the arguments, runs `check` behind a
/// panic guard and answers as the symbol's contract says. Not meant to be called directly.
///
/// # Safety
/// Each argument is null or a NUL-terminated string that stays valid during the call.
pub unsafe fn check_settings_glue<F>(
    kind: *const c_char,
    settings_json: *const c_char,
    config_dir: *const c_char,
    check: F,
) -> *const c_char
where
    F: FnOnce(&str, SettingsText, &Path) -> Result<(), PluginError>,
{
    let text = |ptr: *const c_char| -> String {
        if ptr.is_null() {
            String::new()
        } else {
            // SAFETY: the caller passes NUL-terminated strings valid for the call.
            unsafe { CStr::from_ptr(ptr) }
                .to_string_lossy()
                .into_owned()
        }
    };
    let (kind, settings, config_dir) = (text(kind), text(settings_json), text(config_dir));
    let outcome = catch_unwind(AssertUnwindSafe(|| {
        check(&kind, SettingsText::json(settings), Path::new(&config_dir))
    }))
    .unwrap_or_else(|payload| Err(PluginError::from_panic("check_settings", payload)));
    match outcome {
        Ok(()) => std::ptr::null(),
        Err(refusal) => {
            // An interior NUL cannot cross as a C string.
            let message = refusal.message.replace('\0', " ");
            REFUSAL.with(|slot| {
                let mut slot = slot.borrow_mut();
                *slot = CString::new(message).unwrap_or_default();
                slot.as_ptr()
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::ErrorKind;

    fn call(
        kind: &str,
        settings: &str,
        check: impl FnOnce(&str, SettingsText, &Path) -> Result<(), PluginError>,
    ) -> Option<String> {
        let (kind, settings, dir) = (
            CString::new(kind).unwrap(),
            CString::new(settings).unwrap(),
            CString::new("/etc/switchyard").unwrap(),
        );
        // SAFETY: three NUL-terminated strings that outlive the call.
        let answer =
            unsafe { check_settings_glue(kind.as_ptr(), settings.as_ptr(), dir.as_ptr(), check) };
        (!answer.is_null()).then(|| {
            // SAFETY: a non-null answer is a NUL-terminated string valid until the next call.
            unsafe { CStr::from_ptr(answer) }
                .to_string_lossy()
                .into_owned()
        })
    }

    #[test]
    fn accepted_settings_answer_null_and_a_refusal_its_message() {
        let seen = call("echo", r#"{"slots": 2}"#, |kind, settings, dir| {
            assert_eq!(kind, "echo");
            assert_eq!(settings.text.as_str(), r#"{"slots": 2}"#);
            assert_eq!(dir, Path::new("/etc/switchyard"));
            Ok(())
        });
        assert_eq!(seen, None);
        let refused = call("echo", "{}", |_, _, _| {
            Err(PluginError::new(
                ErrorKind::InvalidSettings,
                "slots must be at least 1",
            ))
        })
        .unwrap();
        assert!(refused.contains("slots must be at least 1"), "{refused}");
    }

    #[test]
    fn a_panicking_check_is_a_refusal_not_an_unwind_across_the_boundary() {
        let refused = call("echo", "{}", |_, _, _| panic!("boom in the check")).unwrap();
        assert!(refused.contains("boom in the check"), "{refused}");
    }
}
