//! `cargo xtask docs`: the lists in the docs that a catalogue of `bypass-common` already
//! knows, written between their markers (`<!-- NAME:start (cargo xtask docs) -->` ...
//! `<!-- NAME:end -->`), or with `--check` failing on every stale one. The lists: the
//! keys `status` prints (`Report::KEYS`, the counters' catalogue among them), what the
//! agent probes the kernel for (`kernel::NEEDS`), the kernel fields the programs read
//! (`KernelLayout::FIELDS`), and every command's options as clap has them (the agent's
//! example `cli_options` prints them: the xtask does not link the agent, and that
//! example's test fails when they are stale, as `committed_docs_are_current` does for
//! the others).

use std::path::Path;

use anyhow::{Context as _, Result, bail};
use bypass_common::{KernelLayout, MIN_KERNEL, kernel::NEEDS, layout::Source, status::Report};
use xtask_lib::{cmd, workspace};

use crate::setup;

/// Arguments of `cargo xtask docs`.
#[derive(Debug, Clone, clap::Args)]
pub struct Args {
    /// Compare instead of writing: fail if a generated list is stale.
    #[arg(long)]
    pub check: bool,
}

/// One generated list: the file it is in (from the workspace root), its markers' name
/// and its text.
struct Block {
    file: &'static str,
    name: &'static str,
    render: fn() -> String,
}

const BLOCKS: [Block; 3] = [
    Block {
        file: "docs/cli.md",
        name: "status-keys",
        render: status_keys,
    },
    Block {
        file: "README.md",
        name: "kernel-needs",
        render: kernel_needs,
    },
    Block {
        file: "docs/design.md",
        name: "kernel-fields",
        render: kernel_fields,
    },
];

/// The markers around the list `name`.
fn markers(name: &str) -> (String, String) {
    (
        format!("<!-- {name}:start (cargo xtask docs) -->"),
        format!("<!-- {name}:end -->"),
    )
}

/// `text` with the list `name` replaced by `body` (pure).
pub fn splice(text: &str, name: &str, body: &str) -> Result<String> {
    let (start, end) = markers(name);
    let (Some(a), Some(b)) = (text.find(&start), text.find(&end)) else {
        bail!("no {start} ... {end} markers");
    };
    if b < a {
        bail!("{end} comes before {start}");
    }
    Ok(format!("{}{start}\n{body}{}", &text[..a], &text[b..]))
}

/// The file and the markers' name of the list of every command's options.
const CLI_OPTIONS: (&str, &str) = ("docs/cli.md", "cli-options");

/// What the agent's example `cli_options` prints: every command's options, from clap.
fn cli_options() -> Result<String> {
    let tools = setup::ensure(setup::Scope::Build)?;
    let mut cargo = tools.cargo()?;
    cargo
        .args(["run", "--quiet", "--locked", "--package", workspace::AGENT])
        .args(["--example", "cli_options"]);
    cmd::output(&mut cargo)
}

/// Each file holding a list, with its text as it is and as generated; the options of
/// the commands only when `cli` is given (they come from the agent).
fn generate(root: &Path, cli: Option<&str>) -> Result<Vec<(&'static str, String, String)>> {
    let mut files: Vec<(&'static str, String, String)> = Vec::new();
    let (cli_file, cli_name) = CLI_OPTIONS;
    let lists = BLOCKS
        .iter()
        .map(|b| (b.file, b.name, (b.render)()))
        .chain(cli.map(|text| (cli_file, cli_name, text.to_owned())));
    for (path, name, body) in lists {
        let at = match files.iter().position(|(f, _, _)| *f == path) {
            Some(at) => at,
            None => {
                let text = std::fs::read_to_string(root.join(path))
                    .with_context(|| format!("read {path}"))?;
                files.push((path, text.clone(), text));
                files.len() - 1
            }
        };
        let file = &mut files[at];
        file.2 = splice(&file.2, name, &body).context(path)?;
    }
    Ok(files)
}

/// The files whose lists are stale.
fn stale(root: &Path, cli: Option<&str>) -> Result<Vec<&'static str>> {
    Ok(generate(root, cli)?
        .into_iter()
        .filter(|(_, have, want)| have != want)
        .map(|(file, _, _)| file)
        .collect())
}

/// What `--check` and the test say of stale files.
fn stale_message(stale: &[&str]) -> String {
    format!(
        "{} {} stale: run `cargo xtask docs`",
        stale.join(", "),
        if stale.len() == 1 { "is" } else { "are" }
    )
}

/// `cargo xtask docs`.
pub fn run(args: &Args) -> Result<()> {
    let root = workspace::root();
    let cli = cli_options()?;
    if args.check {
        let stale = stale(root, Some(&cli))?;
        if !stale.is_empty() {
            bail!("{}", stale_message(&stale));
        }
        println!("docs: the generated lists are current");
        return Ok(());
    }
    for (file, have, want) in generate(root, Some(&cli))? {
        if have != want {
            std::fs::write(root.join(file), want).with_context(|| format!("write {file}"))?;
            println!("docs: wrote {file}");
        }
    }
    Ok(())
}

/// A doc comment as one table cell: rustdoc's link brackets dropped, pipes escaped.
fn cell(text: &str) -> String {
    text.replace("[`", "`")
        .replace("`]", "`")
        .replace('|', "\\|")
}

/// The keys `status` prints, in the order of its JSON: a row each, an object's keys
/// and an array's entries' keys after it, the counters among the others.
fn status_keys() -> String {
    let mut out = String::from("| key | what it is |\n| --- | --- |\n");
    for key in Report::KEYS {
        if key.flatten {
            for k in key.keys {
                out += &format!("| `{}` | {} |\n", k.name, cell(&k.text()));
            }
            continue;
        }
        out += &format!("| `{}` | {} |\n", key.name, cell(&key.text()));
        let parent = if key.each {
            format!("{}[]", key.name)
        } else {
            key.name.to_owned()
        };
        for k in key.keys {
            out += &format!("| `{parent}.{}` | {} |\n", k.name, cell(&k.text()));
        }
    }
    out
}

/// What the agent probes the kernel for, in the order a refusal names it.
fn kernel_needs() -> String {
    let mut out =
        String::from("| the kernel has | what for | upstream since |\n| --- | --- | --- |\n");
    for need in NEEDS {
        let since = need
            .since
            .map_or_else(|| "—".to_owned(), |v| format!("Linux {v}"));
        out += &format!("| {} | {} | {since} |\n", cell(need.what), cell(need.why));
    }
    out += &format!(
        "\nUpstream, a kernel has all of them from Linux {MIN_KERNEL} on (`MIN_KERNEL`, the newest \
         release recorded; —: not recorded, older).\n"
    );
    out
}

/// Where a kernel field is found in BTF, as a cell.
fn source(s: Source) -> String {
    match s {
        Source::Member { strukt, member, or } => {
            let mut at = format!("`struct {strukt}`, `{member}`");
            if let Some((strukt, member)) = or {
                at += &format!(" (or `struct {strukt}`, `{member}`)");
            }
            at
        }
        Source::Bit { name, value } => format!("`enum {name}`, `{value}` (a bit number)"),
        Source::MessageCost { strukt } => format!("the size of `struct {strukt}`"),
    }
}

/// The kernel fields the programs read, in the order the agent reads them from BTF.
fn kernel_fields() -> String {
    let mut out = String::from(
        "| field | in the kernel's BTF | every load needs it | read-only global | what for |\n\
         | --- | --- | --- | --- | --- |\n",
    );
    for f in KernelLayout::FIELDS {
        let doc = f.doc.iter().map(|l| l.trim()).collect::<Vec<_>>().join(" ");
        out += &format!(
            "| `{}` | {} | {} | {} | {} |\n",
            f.name,
            source(f.source),
            if f.required { "yes" } else { "no" },
            f.global
                .map_or_else(|| "—".to_owned(), |g| format!("`{g}`")),
            cell(&doc.replace("KernelLayout::", "")),
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn committed_docs_are_current() {
        let stale = stale(workspace::root(), None).unwrap();
        assert!(stale.is_empty(), "{}", stale_message(&stale));
    }

    #[test]
    fn splice_replaces_only_between_the_markers() {
        let text = "a\n<!-- x:start (cargo xtask docs) -->\nold\n<!-- x:end -->\nb\n";
        let new = splice(text, "x", "new\n").unwrap();
        assert_eq!(
            new,
            "a\n<!-- x:start (cargo xtask docs) -->\nnew\n<!-- x:end -->\nb\n"
        );
        assert_eq!(splice(&new, "x", "new\n").unwrap(), new);
        assert!(splice(text, "y", "new\n").is_err());
    }

    #[test]
    fn lists_name_every_key_counter_and_need() {
        let keys = status_keys();
        for s in bypass_common::Stat::ALL {
            assert!(keys.contains(&format!("| `{}` | {} |", s.name(), s.help())));
        }
        assert!(keys.contains("| `features.fionread` |"), "{keys}");
        assert!(keys.contains("| `refusals[].pairing` |"), "{keys}");
        assert!(!keys.contains("| `counters` |"), "flattened: {keys}");
        let needs = kernel_needs();
        assert!(needs.contains(
            "| bpf_get_netns_cookie in sock_ops (Linux 5.15, or backported) | every bypass key \
             carries the socket's network namespace | Linux 5.15 |"
        ));
        assert!(needs.contains("from Linux 5.19 on"));
        let fields = kernel_fields();
        assert!(fields.contains("| `sk_flags` | `struct sock_common`, `skc_flags` (or `struct sock`, `sk_flags`) | no | `BYPASS_OFF_SK_FLAGS` |"), "{fields}");
        for text in [keys, needs, fields] {
            assert!(!text.contains("[`") && !text.contains("`]"), "{text}");
        }
    }
}
