//! What only a session cell's result has, under `cell` of `run_python`'s
//! result (the last expression's value, the exception), and its part of
//! the text; and what runs and cells both have: the files they changed,
//! the images they made.

use schemars::JsonSchema;
use serde::Serialize;

use pycell_runner::session::{ChangedFile, Image};

/// What a session cell has beyond a run's result.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct CellInfo {
    /// The session the cell ran in.
    pub session: String,
    /// The cell's number in its session (1, 2, ...); 0 if it never ran.
    pub number: u64,
    /// The repr of the cell's last expression, as a Python REPL shows it
    /// (absent when the cell ends with a statement, or the value is None).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub value: Option<String>,
    /// True if the value's repr was longer than the cap and was cut.
    pub value_truncated: bool,
    /// The exception the cell ended with, if it did.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub exception: Option<CellException>,
    /// The session's memory when the cell ended, in bytes.
    pub memory_bytes: u64,
}

/// The exception a cell ended with.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct CellException {
    /// Its class, e.g. `ZeroDivisionError`, `KeyboardInterrupt`.
    #[serde(rename = "type")]
    pub kind: String,
    pub message: String,
    /// As python prints it, frames of the cell only.
    pub traceback: String,
}

/// A file a cell created or changed.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct FileChange {
    pub path: String,
    pub size: u64,
    /// Its sha256 in hex (absent when the run's files were too large together to read).
    pub sha256: Option<String>,
    /// True if the file is new.
    pub created: bool,
}

/// An image in the result's content.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct ImageInfo {
    /// Where the full-size image is in /workspace (read it with read_file).
    pub path: String,
    /// Size of the image as sent, in pixels.
    pub width: u32,
    pub height: u32,
    /// Size of the PNG sent, in bytes.
    pub png_bytes: u64,
}

impl From<&ChangedFile> for FileChange {
    fn from(f: &ChangedFile) -> FileChange {
        FileChange {
            path: f.path.clone(),
            size: f.size,
            sha256: f.sha256.clone(),
            created: f.created,
        }
    }
}

pub fn image_info(i: &Image) -> ImageInfo {
    ImageInfo {
        path: i.path.clone(),
        width: i.width,
        height: i.height,
        png_bytes: pycell_protocol::bounds::base64_decoded_len(&i.png).unwrap_or(0),
    }
}

/// The cell part of a result for a cell that never ran (its session
/// was over).
pub fn no_cell(session: &str) -> CellInfo {
    CellInfo {
        session: session.to_string(),
        number: 0,
        value: None,
        value_truncated: false,
        exception: None,
        memory_bytes: 0,
    }
}

/// A cell's part of the text content: the value, the exception.
pub fn render_cell(c: &CellInfo, text: &mut String) {
    if let Some(e) = &c.exception {
        text.push_str(&format!("\n--- exception ---\n{}", e.traceback));
        if !e.traceback.ends_with('\n') {
            text.push('\n');
        }
    }
    if let Some(v) = &c.value {
        let cut = if c.value_truncated {
            " [truncated]"
        } else {
            ""
        };
        text.push_str(&format!("\nOut[{}]: {v}{cut}\n", c.number));
    }
}

/// The images' part of the text content.
pub fn render_images(images: &[ImageInfo], omitted: u32, text: &mut String) {
    for i in images {
        text.push_str(&format!(
            "image: {} (sent at {}x{})\n",
            i.path, i.width, i.height
        ));
    }
    if omitted > 0 {
        text.push_str(&format!(
            "{omitted} more images were not sent (over the result's image budget); their files are listed\n"
        ));
    }
}

/// The images as MCP image content, in order (each a PNG the launcher
/// checked).
pub fn image_content(images: &[Image]) -> Vec<rmcp::model::ContentBlock> {
    images
        .iter()
        .map(|i| rmcp::model::ContentBlock::image(i.png.clone(), "image/png"))
        .collect()
}
