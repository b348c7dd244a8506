//! The front end against the phi4mm-tiny fixture's reference outputs, and against hostile input.

mod audio;
mod hostile;
mod image;
mod prompt;
