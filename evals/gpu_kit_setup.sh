# Sourced at the start of every call of a GPU lease, in the checkout's root:
#     source evals/gpu_kit_setup.sh && python3 -m evals.gpu_session ...
# The kit is .gpu/ (evals/gpu_kit.py builds it). What a call sets up stays in the scratch
# folder while the machine is warm: the wheels and package stubs install once, each call's
# model chunk is kept, and the call that brings the last chunk unpacks the demo models.

tts_kit=$PWD/.gpu
tts_scratch=${TTS_KIT_SCRATCH:-/tmp}
tts_site=$tts_scratch/site
if [ ! -e "$tts_site/.installed" ]; then
    if [ ! -d "$tts_kit/common" ]; then
        echo "gpu kit: nothing installed yet: the first call carries .gpu/common (a machine that went back starts bare)"
        return 1
    fi
    mkdir -p "$tts_site"
    if ls "$tts_kit"/common/whl/*.whl > /dev/null 2>&1; then
        python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
            --target "$tts_site" "$tts_kit"/common/whl/*.whl || return 1
    fi
    cp -r "$tts_kit"/common/site/. "$tts_site"/ && touch "$tts_site/.installed" || return 1
fi
export PYTHONPATH=$tts_site:$PWD TTS_DATA_DIR=$tts_kit/data

tts_chunks=$tts_scratch/kit
mkdir -p "$tts_chunks"
if [ ! -e "$tts_chunks/.unpacked" ]; then
    for tts_chunk in "$tts_kit"/c[0-9][0-9]; do
        [ -f "$tts_chunk" ] && cp "$tts_chunk" "$tts_chunks"/
    done
    tts_want=$(cat "$tts_kit/meta/chunks")
    tts_have=$(find "$tts_chunks" -maxdepth 1 -name 'c[0-9][0-9]' | wc -l)
    if [ "$tts_have" -eq "$tts_want" ]; then
        mkdir -p "$tts_chunks/unpacked"
        cat "$tts_chunks"/c[0-9][0-9] | tar x -C "$tts_chunks/unpacked" \
            && (cd "$tts_chunks/unpacked" && sha256sum -c --quiet "$tts_kit/meta/SHA256SUMS") || return 1
        cp -r "$tts_chunks/unpacked/site/." "$tts_site"/ && mkdir -p "$HOME" \
            && cp -r "$tts_chunks/unpacked/home/." "$HOME"/ || return 1
        rm -rf "$tts_chunks/unpacked" "$tts_chunks"/c[0-9][0-9]
        touch "$tts_chunks/.unpacked"
        echo "gpu kit: the demo models are in place"
    else
        echo "gpu kit: $tts_have of $tts_want model chunks here"
    fi
fi
