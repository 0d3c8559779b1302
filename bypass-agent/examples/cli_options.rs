//! The options of every `bypass-agent` command as markdown tables, from its clap
//! definitions (their doc comments are the `--help` text): `cargo xtask docs` writes
//! what this prints into docs/cli.md between the `cli-options` markers, and the test
//! below fails when that list is stale. An example, not a test of the xtask's, because
//! the xtask does not link the agent.

use bypass_agent::cli::Cli;
use clap::{Arg, Command, CommandFactory as _};

fn main() {
    print!("{}", tables());
}

/// A table for the options every command takes, then one per command (and per help
/// heading of its options), in the order `--help` lists them.
fn tables() -> String {
    let mut cli = Cli::command();
    cli.build();
    let mut out = table("every command", cli.get_arguments().filter(|a| shown(a)));
    for cmd in cli.get_subcommands() {
        let args: Vec<&Arg> = cmd
            .get_arguments()
            .filter(|a| shown(a) && !a.is_global_set())
            .collect();
        let mut headings: Vec<Option<&str>> = Vec::new();
        for a in &args {
            if !headings.contains(&a.get_help_heading()) {
                headings.push(a.get_help_heading());
            }
        }
        for heading in headings {
            let title = match heading {
                Some(h) => format!("{} ({})", name(cmd), h.to_lowercase()),
                None => name(cmd),
            };
            let rows = args.iter().copied();
            out += &table(&title, rows.filter(|a| a.get_help_heading() == heading));
        }
    }
    out
}

/// `bypass-agent NAME`'s name, as a heading.
fn name(cmd: &Command) -> String {
    format!("`{}`", cmd.get_name())
}

/// Whether an option is one of ours (not clap's `--help` or `--version`).
fn shown(a: &Arg) -> bool {
    !a.is_hide_set() && !["help", "version"].contains(&a.get_id().as_str())
}

/// One table: option, what it means (its doc comment, and the variable it is also read
/// from), its default.
fn table<'a>(title: &str, args: impl Iterator<Item = &'a Arg>) -> String {
    let mut out = format!("\n### {title}\n\n| option | meaning | default |\n| --- | --- | --- |\n");
    for a in args {
        let mut option = a.get_long().map(|l| format!("--{l}")).unwrap_or_default();
        if let Some(s) = a.get_short() {
            option = format!("-{s}, {option}");
        }
        if a.get_action().takes_values() {
            let values = a.get_value_names().unwrap_or_default();
            option += &format!(
                " {}",
                values
                    .iter()
                    .map(|v| v.as_str())
                    .collect::<Vec<_>>()
                    .join(" ")
            );
        }
        let help = a
            .get_long_help()
            .or(a.get_help())
            .map(ToString::to_string)
            .unwrap_or_default();
        let mut meaning = help.split_whitespace().collect::<Vec<_>>().join(" ");
        if let Some(env) = a.get_env() {
            meaning += &format!(" (also `${}`)", env.to_string_lossy());
        }
        let defaults: Vec<String> = a
            .get_default_values()
            .iter()
            .map(|v| format!("`{}`", v.to_string_lossy()))
            .collect();
        let default = if defaults.is_empty() {
            "—".to_owned()
        } else {
            defaults.join(", ")
        };
        out += &format!(
            "| `{}` | {} | {default} |\n",
            cell(option.trim()),
            cell(&meaning)
        );
    }
    out
}

/// Text as one table cell.
fn cell(text: &str) -> String {
    text.replace('|', "\\|")
}

#[cfg(test)]
mod tests {
    /// The markers around the list in docs/cli.md.
    const START: &str = "<!-- cli-options:start (cargo xtask docs) -->\n";
    const END: &str = "<!-- cli-options:end -->";

    #[test]
    fn docs_cli_md_lists_every_option_as_clap_has_it() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/cli.md");
        let doc = std::fs::read_to_string(path).unwrap();
        let listed = doc
            .split_once(START)
            .and_then(|(_, rest)| rest.split_once(END))
            .map(|(list, _)| list);
        assert_eq!(
            listed,
            Some(super::tables().as_str()),
            "docs/cli.md is stale: run `cargo xtask docs`"
        );
    }
}
