"""docs/deploy.md's code blocks, read by its tests: the page's own test
(test_deploy_doc.py) and the upstream suite's (tests/upstream/
test_deploy_settings.py).  The fence's info string says what a block is:
`sh` runs here, `sh engine` starts vLLM or SGLang, `yaml sglang` is
SGLang's LMCache file, `sh system` changes the machine."""
import json
import os
import re
import shlex

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PAGE = os.path.join(ROOT, "docs", "deploy.md")


def blocks(path=PAGE):
    """[(section, info, text)]: each fenced block with the `## ` section it
    is in and its fence's info string."""
    out, section, info, lines = [], None, None, None
    with open(path) as f:
        for line in f:
            if lines is None and line.startswith("## "):
                section = line[3:].strip()
            elif line.startswith("```"):
                if lines is None:
                    info, lines = line[3:].strip(), []
                else:
                    out.append((section, info, "".join(lines)))
                    lines = None
            elif lines is not None:
                lines.append(line)
    return out


def commands(text):
    """The commands of a block: continuation lines joined, comments kept."""
    return [c.strip() for c in re.sub(r"\\\n\s*", " ", text).splitlines() if c.strip()]


def flag(words, name, default=None):
    return words[words.index(name) + 1] if name in words else default


def one_node_server():
    """(host, port) the one-node section's lmcached listens on for ZMQ."""
    for section, info, text in blocks():
        if section == "One node" and info == "sh":
            for cmd in commands(text):
                if cmd.startswith("lmcached "):
                    words = shlex.split(cmd.split(" &")[0])
                    return flag(words, "--host", "localhost"), int(flag(words, "--port", "5555"))
    raise AssertionError("docs/deploy.md starts no lmcached in \"One node\"")


def vllm_config():
    """The JSON of the vLLM command's --kv-transfer-config."""
    for _, info, text in blocks():
        for cmd in commands(text):
            if info == "sh engine" and cmd.startswith("vllm serve "):
                return json.loads(flag(shlex.split(cmd), "--kv-transfer-config"))
    raise AssertionError("docs/deploy.md has no `vllm serve` block")


def sglang_file():
    """(path, text): SGLang's LMCache file and where the page saves it."""
    (text,) = [t for _, info, t in blocks() if info == "yaml sglang"]
    with open(PAGE) as f:
        path = re.search(r"Save this as `([^`]+)`", f.read()).group(1)
    return path, text


def sglang_command():
    for _, info, text in blocks():
        for cmd in commands(text):
            if info == "sh engine" and "sglang.launch_server" in cmd:
                return shlex.split(cmd)
    raise AssertionError("docs/deploy.md has no SGLang block")
