#!/usr/bin/env bash
# Assembles the image's whole root file system in ROOTFS, from the Debian
# stage it runs in (which has python3, numpy and ca-certificates installed)
# and the staged build in STAGED (scripts/build.sh's OUT: bin/ and lib/).
# The Dockerfile's last stage is FROM scratch and copies ROOTFS alone, so the
# image holds what the binaries and Python models run on and nothing else:
# no shell, no package manager, no setuid programs.
#
#   scripts/image-rootfs.sh STAGED ROOTFS
#
# What goes in:
# - STAGED/bin/* in /usr/local/bin (nereid, and the links naming its
#   programs), STAGED/lib/* in /usr/local/lib (the ONNX
#   Runtime library, and in the GPU variant its execution providers and the
#   CUDA libraries they load);
# - python3.11 with its standard library (less the test suite, IDLE, Tk and
#   the installers no server runs) and numpy, for Python models
#   (backend "python");
# - every shared library those programs and Python's extension modules
#   link, found with ldd, as real files (not links into /etc/alternatives),
#   and a loader cache made by ldconfig;
# - the CA bundle (object-storage fetches verify TLS against it), passwd and
#   group naming root and nereid (65532), nsswitch.conf, and an empty /models
#   and /tmp (mode 1777; a pod mounts an emptyDir there).
set -euo pipefail

staged=${1:?usage: image-rootfs.sh STAGED ROOTFS}
rootfs=${2:?usage: image-rootfs.sh STAGED ROOTFS}

python=$(readlink -f /usr/bin/python3)
pyver=$(basename "$python")

rm -rf "$rootfs"
# proc, dev, sys: where a container runtime mounts those.
mkdir -p "$rootfs"/{usr/bin,usr/lib,usr/local/bin,usr/local/lib,etc/ssl/certs,models,tmp,proc,dev,sys}
# Debian's merged /usr: the loader's path (/lib64/ld-linux-x86-64.so.2) and
# the paths ldd prints (/lib/x86_64-linux-gnu/...) go through these links.
for dir in bin lib lib64 sbin; do
    if [ -L "/$dir" ]; then
        ln -s "$(readlink "/$dir")" "$rootfs/$dir"
        mkdir -p "$rootfs/usr/$dir"
    fi
done
chmod 1777 "$rootfs/tmp"

# bin/ holds one binary and links to it by the programs' names: copied as
# they are.
cp -a "$staged"/bin/. "$rootfs/usr/local/bin/"
install -m 0644 "$staged"/lib/* "$rootfs/usr/local/lib/"

install -m 0755 "$python" "$rootfs/usr/bin/$pyver"
ln -s "$pyver" "$rootfs/usr/bin/python3"
# The standard library and numpy, with the byte code Debian compiled at
# install time (a read-only root cannot cache it later). Left out: what only
# develops or tests Python (test suites, IDLE, Tk, installers, headers,
# numpy's distutils and f2py), and the extension modules that would drag in
# libraries of their own for a terminal or a database (curses, readline,
# sqlite3, dbm, NIS). Links are kept as links; the one that leaves the
# folder (sitecustomize.py -> /etc/pythonX.Y) is followed by copying
# /etc/pythonX.Y too.
stdlib=usr/lib/$pyver
dynload=$stdlib/lib-dynload
numpy=usr/lib/python3/dist-packages/numpy
tar -C / -c \
    --exclude="$stdlib/test" --exclude="$stdlib/idlelib" --exclude="$stdlib/tkinter" \
    --exclude="$stdlib/turtledemo" --exclude="$stdlib/ensurepip" --exclude="$stdlib/lib2to3" \
    --exclude="$stdlib/pydoc_data" --exclude="$stdlib/config-*" --exclude="$stdlib/venv" \
    --exclude="$stdlib/curses" --exclude="$stdlib/sqlite3" --exclude="$stdlib/dist-packages" \
    --exclude="$dynload/_curses*" --exclude="$dynload/readline.*" --exclude="$dynload/_dbm.*" \
    --exclude="$dynload/_gdbm.*" --exclude="$dynload/_sqlite3.*" --exclude="$dynload/nis.*" \
    --exclude="$dynload/_test*" --exclude="$dynload/_ctypes_test.*" --exclude="$dynload/xxlimited*" \
    --exclude="$dynload/_xxtestfuzz.*" --exclude="$dynload/ossaudiodev.*" \
    --exclude="$numpy/tests" --exclude="$numpy/*/tests" --exclude="$numpy/core/include" \
    --exclude="$numpy/distutils" --exclude="$numpy/f2py" --exclude="$numpy/random/_examples" \
    "$stdlib" "etc/$pyver" "$numpy" \
    usr/lib/python3/dist-packages/numpy-*.egg-info |
    tar -C "$rootfs" -x

# Every ELF file shipped, then the libraries they need, transitively (ldd
# prints the whole closure).
mapfile -t elves < <(
    find "$rootfs/usr/local" "$rootfs/usr/bin" "$rootfs/usr/lib/$pyver" "$rootfs/usr/lib/python3" \
        -type f \( -perm -u+x -o -name '*.so' -o -name '*.so.*' \) -print |
        while read -r file; do
            if [ "$(head -c 4 "$file" | od -An -c | tr -d ' ')" = '177ELF' ]; then echo "$file"; fi
        done
)
missing=()
for elf in "${elves[@]}"; do
    # The file as it is outside ROOTFS, where its libraries are installed.
    original=${elf#"$rootfs"}
    [ -e "$original" ] || original=$elf
    while read -r line; do
        case $line in
            *"=> not found"*) missing+=("$(basename "$elf"): ${line%% *}") ;;
            *"=> /"*)
                lib=${line#*=> }
                lib=${lib%% (*}
                # Libraries beside the staged ones resolve there (the GPU
                # variant's CUDA libraries); the rest come from the system.
                # Python's own modules are shipped above or left out on
                # purpose.
                case $lib in "$staged"/* | "$rootfs"/* | */python3*) continue ;; esac
                if [ ! -e "$rootfs$lib" ]; then
                    mkdir -p "$rootfs$(dirname "$lib")"
                    cp -L "$lib" "$rootfs$lib"
                fi
                ;;
            /*)
                # The loader itself.
                lib=${line%% (*}
                if [ ! -e "$rootfs$lib" ]; then
                    mkdir -p "$rootfs$(dirname "$lib")"
                    cp -L "$lib" "$rootfs$lib"
                fi
                ;;
        esac
    done < <(LD_LIBRARY_PATH="$staged/lib" ldd "$original" 2>/dev/null || true)
done
# The GPU variant's providers load the CUDA driver (libcuda.so.1), which the
# NVIDIA container runtime mounts at run time; anything else missing is a
# broken image.
unresolved=$(printf '%s\n' "${missing[@]}" | grep -v ': libcuda\.so\.1$' | sort -u || true)
if [ -n "$unresolved" ]; then
    echo "image-rootfs: libraries not found:" >&2
    echo "$unresolved" >&2
    exit 1
fi

cp /etc/ssl/certs/ca-certificates.crt "$rootfs/etc/ssl/certs/"
cp /etc/nsswitch.conf "$rootfs/etc/"
cat > "$rootfs/etc/passwd" <<'EOF'
root:x:0:0:root:/root:/usr/sbin/nologin
nereid:x:65532:65532:nereid:/nonexistent:/usr/sbin/nologin
EOF
cat > "$rootfs/etc/group" <<'EOF'
root:x:0:
nereid:x:65532:
EOF
# The loader's cache, over Debian's list of folders (/usr/local/lib among
# them).
cp -r /etc/ld.so.conf /etc/ld.so.conf.d "$rootfs/etc/"
ldconfig -r "$rootfs"

echo "image-rootfs: $(du -sh --apparent-size "$rootfs" | cut -f1) in $rootfs (${#elves[@]} programs and libraries shipped)" >&2
