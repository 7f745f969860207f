#!/usr/bin/env python3
"""tokenize.py — text or JSONL files into the LKTOK token file `llmkern train` reads
(data: { tokens: FILE }), with a Hugging Face tokenizer.json and the `tokenizers` package.

    python3 scripts/tokenize.py --tokenizer Qwen3-0.6B/tokenizer.json --out data.lktok a.txt b.jsonl
    # then, in the training config:  data: { tokens: data.lktok }   model.vocab_size >= the vocab

Documents: in a .jsonl / .json-lines file each line is a JSON object and its --key field
(default "text") one document; in any other file documents are separated by blank lines,
as `data: { text: FILE }` reads them. Each document is encoded without special tokens and
followed by the EOS id: --eos-id N, or the id of --eos-token, or else the first of
<|endoftext|>, </s>, <eos>, <|end_of_text|> the tokenizer has. The file is LKTOK version 2
(include/llmkern/data.h): uint16 ids when the vocabulary fits, else uint32, and the
header holds the tokenizer's vocabulary (with added tokens) and the EOS id, which the
trainer takes as data.eos_id and names when an id is not below model.vocab_size. Written
atomically (a temporary file renamed into place).

--train-bpe N first trains a byte-level BPE of N ids on the inputs with `tokenizers`
itself and saves it at --tokenizer (for tests and quick starts: nothing is downloaded).

`tokenizers` is this script's only dependency: when it cannot be imported, the script
creates a virtual environment (LLMKERN_TOKENIZE_VENV, default
~/.cache/llmkern/tokenize-venv, or the temporary directory's without a writable home),
installs it there with pip, and runs itself again in it.
Exit status: 0 done, 2 bad input (the message names the file, line and field).
"""
import argparse
import json
import os
import struct
import subprocess
import sys

EOS_NAMES = ["<|endoftext|>", "</s>", "<eos>", "<|end_of_text|>"]
VENV_FLAG = "LLMKERN_TOKENIZE_IN_VENV"


def fail(msg):
    print(f"tokenize.py: {msg}", file=sys.stderr)
    sys.exit(2)


def ensure_tokenizers():
    """Imports tokenizers, or re-runs this script in a venv that has it."""
    try:
        import tokenizers  # noqa: F401
        return
    except ImportError:
        pass
    if os.environ.get(VENV_FLAG):
        fail("the package 'tokenizers' is still not importable in the virtual environment "
             f"{sys.prefix}: remove it and run again")
    venv = os.environ.get("LLMKERN_TOKENIZE_VENV")
    if not venv:   # the user's cache, or a temporary directory where there is no writable home
        cache = os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache")
        try:
            os.makedirs(os.path.join(cache, "llmkern"), exist_ok=True)
            venv = os.path.join(cache, "llmkern", "tokenize-venv")
        except OSError:
            import tempfile
            venv = os.path.join(tempfile.gettempdir(), f"llmkern-tokenize-venv-{os.getuid()}")
    py = os.path.join(venv, "bin", "python3")
    try:
        if not os.path.exists(py):
            print(f"tokenize.py: 'tokenizers' is not installed: creating {venv}", file=sys.stderr)
            subprocess.run([sys.executable, "-m", "venv", venv], check=True, stdout=sys.stderr)
        if subprocess.run([py, "-c", "import tokenizers"], capture_output=True).returncode != 0:
            print(f"tokenize.py: installing tokenizers into {venv} (pip)", file=sys.stderr)
            subprocess.run([py, "-m", "pip", "install", "-q", "--disable-pip-version-check", "tokenizers"],
                           check=True, stdout=sys.stderr)
    except (OSError, subprocess.CalledProcessError) as e:
        fail(f"cannot set up {venv} with 'tokenizers' ({e}); on Debian, python3-venv provides "
             "'python3 -m venv' (scripts/install-deps.sh installs it), or pip install tokenizers")
    env = dict(os.environ, **{VENV_FLAG: "1"})
    os.execve(py, [py, os.path.abspath(__file__)] + sys.argv[1:], env)


def read_documents(path, key):
    """The documents of one input file, as strings."""
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except OSError as e:
        fail(f"{path}: cannot read: {e.strerror}")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        fail(f"{path}: not UTF-8 text (byte {e.start})")
    docs = []
    if path.endswith((".jsonl", ".json")):
        for n, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as e:
                fail(f"{path}:{n}: not a JSON object: {e.msg} (column {e.colno})")
            if not isinstance(obj, dict) or key not in obj:
                fail(f"{path}:{n}: expected an object with a \"{key}\" field (--key), got "
                     f"{'keys ' + ', '.join(map(repr, obj)) if isinstance(obj, dict) else type(obj).__name__}")
            if not isinstance(obj[key], str):
                fail(f"{path}:{n}: \"{key}\": expected a string, got {type(obj[key]).__name__}")
            if obj[key]:
                docs.append(obj[key])
    else:   # blank-line separated, each document keeping its lines' newlines (as dataset.c)
        cur = []
        for line in text.splitlines(keepends=True):
            if line.strip(" \t\r\n") == "":
                if cur:
                    docs.append("".join(cur))
                cur = []
            else:
                cur.append(line)
        if cur:
            docs.append("".join(cur))
    if not docs:
        fail(f"{path}: no document (empty, blank lines only, or no \"{key}\" text)")
    return docs


def train_bpe(docs, vocab_size, path):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["<|endoftext|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(docs, trainer=trainer)
    tok.save(path)


def write_lktok(path, ids, vocab, eos):
    width = 2 if vocab <= 65536 else 4
    header = b"LKTOK" + struct.pack("<BBB", 2, width, 0) + struct.pack("<QQq", len(ids), vocab, eos)
    import array
    a = array.array("H" if width == 2 else "I", ids)
    if a.itemsize != width:
        a = array.array("L", ids) if array.array("L").itemsize == width else None
        if a is None:
            fail(f"no {width}-byte unsigned array type on this Python")
    if sys.byteorder != "little":
        a.byteswap()
    tmp = f"{path}.tmp{os.getpid()}"
    try:
        with open(tmp, "wb") as f:
            f.write(header)
            a.tofile(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as e:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        fail(f"{path}: cannot write: {e.strerror}")
    return width


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("inputs", nargs="+", help="text files (blank-line separated documents) or .jsonl files")
    p.add_argument("--tokenizer", required=True, help="a Hugging Face tokenizer.json (written with --train-bpe)")
    p.add_argument("--out", required=True, help="the LKTOK file to write")
    p.add_argument("--key", default="text", help="the JSONL field holding a document's text (default: text)")
    p.add_argument("--eos-id", type=int, help="the id appended to every document")
    p.add_argument("--eos-token", help="the token appended to every document (its id)")
    p.add_argument("--train-bpe", type=int, metavar="N", help="first train a byte-level BPE of N ids on the inputs")
    a = p.parse_args()
    ensure_tokenizers()
    from tokenizers import Tokenizer

    docs = [d for path in a.inputs for d in read_documents(path, a.key)]
    if a.train_bpe is not None:
        if not 257 <= a.train_bpe <= 1 << 20:
            fail(f"--train-bpe: expected 257..{1 << 20} ids (the 256 bytes and <|endoftext|> at least), "
                 f"got {a.train_bpe}")
        train_bpe(docs, a.train_bpe, a.tokenizer)
    try:
        tok = Tokenizer.from_file(a.tokenizer)
    except Exception as e:   # tokenizers raises a plain Exception for a bad file
        fail(f"--tokenizer {a.tokenizer}: cannot load: {e}")
    vocab = tok.get_vocab_size(with_added_tokens=True)
    if a.eos_id is not None and a.eos_token is not None:
        fail("--eos-id and --eos-token: expected one of them, got both")
    if a.eos_id is not None:
        eos = a.eos_id
        if not 0 <= eos < vocab:
            fail(f"--eos-id: expected 0..{vocab - 1} (the tokenizer's vocabulary), got {eos}")
    elif a.eos_token is not None:
        eos = tok.token_to_id(a.eos_token)
        if eos is None:
            fail(f"--eos-token: '{a.eos_token}' is not in {a.tokenizer}")
    else:
        found = [(n, tok.token_to_id(n)) for n in EOS_NAMES if tok.token_to_id(n) is not None]
        if not found:
            fail(f"{a.tokenizer}: none of {', '.join(EOS_NAMES)} is a token: give --eos-id or --eos-token")
        eos = found[0][1]
    ids = []
    for enc in tok.encode_batch(docs, add_special_tokens=False):
        ids.extend(enc.ids)
        ids.append(eos)
    top = max(ids)
    if top >= vocab:   # an id past get_vocab_size: the tokenizer file is inconsistent
        fail(f"{a.tokenizer}: produced id {top}, beyond its vocabulary of {vocab}")
    width = write_lktok(a.out, ids, vocab, eos)
    print(f"{a.out}: {len(ids)} tokens in {len(docs)} documents ({sum(map(len, docs))} characters), "
          f"uint{8 * width}, vocabulary {vocab}, eos {eos} ({tok.id_to_token(eos)!r}); "
          f"train with  data: {{ tokens: {a.out} }}  and model.vocab_size >= {vocab}")


if __name__ == "__main__":
    main()
