"""Reads an image's OCI config (`buildah inspect --type image` on standard
input) and prints it as
bash assignments for scripts/image.sh: IMAGE_USER, and the arrays
IMAGE_ENTRYPOINT, IMAGE_CMD and IMAGE_ENV. It refuses an image that would
run as root, names no entrypoint, or lacks its OCI labels."""

import json
import shlex
import sys

LABELS = ("org.opencontainers.image.source", "org.opencontainers.image.revision", "org.opencontainers.image.version")


def main() -> int:
    config = json.load(sys.stdin)["OCIv1"]["config"]
    problems = []
    user = config.get("User") or ""
    if user.split(":")[0] in ("", "0", "root"):
        problems.append(f"the image runs as root (User '{user}')")
    elif ":" not in user:
        problems.append(f"the image's User '{user}' names no group")
    if not config.get("Entrypoint"):
        problems.append("the image names no Entrypoint")
    labels = config.get("Labels") or {}
    problems += [f"the image lacks the label {label}" for label in LABELS if not labels.get(label)]
    if problems:
        print("\n".join(problems), file=sys.stderr)
        return 1

    def array(values):
        return "(" + " ".join(shlex.quote(v) for v in values or []) + ")"

    print(f"IMAGE_USER={shlex.quote(user)}")
    print(f"IMAGE_ENTRYPOINT={array(config['Entrypoint'])}")
    print(f"IMAGE_CMD={array(config.get('Cmd'))}")
    print(f"IMAGE_ENV={array(config.get('Env'))}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
