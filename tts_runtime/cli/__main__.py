"""`python -m tts_runtime.cli`: the `tts` command line."""

from tts_runtime.cli import main

main()
