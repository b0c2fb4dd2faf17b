"""The JDK's Java sources (Debian's openjdk-17-source) as a line-completion corpus, unpacked once.

`line-java` cuts lines from the `java.base` module's `java/` packages (util, lang, io, time, ...):
real, well-kept Java that none of the shipped exit artefacts was trained on (they saw Python).
"""

from __future__ import annotations

import zipfile
from pathlib import Path

from ..paths import cache_root

SRC_ZIPS = ("/usr/lib/jvm/openjdk-17/lib/src.zip", "/usr/lib/jvm/java-17-openjdk-amd64/lib/src.zip",
            "/usr/lib/jvm/java-17-openjdk-arm64/lib/src.zip")
MEMBER_PREFIX = "java.base/java/"


def find_src_zip() -> Path:
    for candidate in SRC_ZIPS:
        if Path(candidate).is_file():
            return Path(candidate)
    raise FileNotFoundError("the JDK 17 sources are not installed: run `apt-get install openjdk-17-source` "
                            f"(looked for {', '.join(SRC_ZIPS)})")


def jdk_java_root() -> Path:
    """A folder holding java.base/java/**.java, unpacked from src.zip on first use."""
    root = cache_root() / "data" / "jdk17-java-base"
    done = root / ".complete"
    if done.is_file():
        return root
    with zipfile.ZipFile(find_src_zip()) as zf:
        members = [m for m in zf.namelist() if m.startswith(MEMBER_PREFIX) and m.endswith(".java")]
        zf.extractall(root, members)
    done.write_text(f"{len(members)} files\n")
    return root
