//! `pycell mcp-token NAME`: a new bearer token and its line for the tokens
//! file. The token is 32 random bytes (base64url, after `pycell_`); only
//! its SHA-256 goes into the file.

use base64::Engine;

use super::callers::{check_name, hex, token_hash, SCOPES, SCOPE_RUN};
use crate::args::McpTokenArgs;
use crate::start_error::StartError;

pub fn main(args: &McpTokenArgs) -> i32 {
    match entry(args) {
        Ok((token, toml)) => {
            eprintln!("pycell mcp-token: the token for {:?} (give it to its caller; only its hash is kept):\n{token}", args.name);
            print!("{toml}");
            0
        }
        Err(e) => {
            eprintln!("pycell mcp-token: {e}");
            2
        }
    }
}

fn entry(args: &McpTokenArgs) -> Result<(String, String), StartError> {
    check_name(&args.name)?;
    if let Some(s) = args.scopes.iter().find(|s| !SCOPES.contains(&s.as_str())) {
        let problem = format!("{s:?}: the scopes are {}", SCOPES.join(", "));
        return Err(StartError::flag("--scope", problem));
    }
    let mut bytes = [0u8; 32];
    getrandom::fill(&mut bytes)
        .map_err(|e| StartError::host("no randomness", std::io::Error::other(e.to_string())))?;
    let token = format!(
        "pycell_{}",
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes)
    );
    let scopes = match args.scopes.is_empty() {
        true => vec![SCOPE_RUN.to_string()],
        false => args.scopes.clone(),
    };
    let toml = format!(
        "\n[[token]]\nname = \"{}\"\nsha256 = \"{}\"\nscopes = [{}]\n",
        args.name,
        hex(&token_hash(&token)),
        scopes
            .iter()
            .map(|s| format!("\"{s}\""))
            .collect::<Vec<_>>()
            .join(", ")
    );
    Ok((token, toml))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::http::callers::TokenTable;

    #[test]
    fn the_entry_loads_and_maps_the_token_to_its_name() {
        let args = McpTokenArgs {
            name: "ci-bot".into(),
            scopes: vec!["pycell:run".into(), "pycell:tools".into()],
        };
        let (token, toml) = entry(&args).unwrap();
        assert!(token.starts_with("pycell_") && token.len() > 40);
        let table = TokenTable::parse(&toml).unwrap();
        let c = table.caller(&token).unwrap();
        assert_eq!(&**c.identity(), "ci-bot");
        assert!(c.scopes.run && c.scopes.tools);
        let (other, _) = entry(&args).unwrap();
        assert_ne!(token, other);
        let bad = McpTokenArgs {
            name: "ci bot".into(),
            scopes: vec![],
        };
        assert!(entry(&bad).is_err());
    }
}
