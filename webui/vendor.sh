#!/bin/sh
# Fetches the page's front-end libraries from the npm registry (`npm pack`, which checks each
# tarball against the registry's integrity hash) and copies their built browser files and
# licences into webui/vendor/, where they are committed; `kiln` embeds them at compile time,
# so building kiln never needs the network. Run it again after changing a version below, then
# commit webui/vendor/.
set -eu

MARKED=18.2.1          # Markdown to HTML
HIGHLIGHT=11.12.0      # code highlighting (@highlightjs/cdn-assets: the browser build)
DOMPURIFY=3.5.0        # sanitizes the HTML marked makes of a model's answer

here=$(cd "$(dirname "$0")" && pwd)
out="$here/vendor"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

cd "$tmp"
npm pack --silent "marked@$MARKED" "@highlightjs/cdn-assets@$HIGHLIGHT" "dompurify@$DOMPURIFY" >/dev/null
for t in *.tgz; do
    mkdir "${t%.tgz}"
    tar xzf "$t" -C "${t%.tgz}"
done

# The built files, without their source-map references (the maps are not shipped).
strip_map() { sed '/^\/\/# sourceMappingURL=/d' "$1" >"$2"; }
mkdir -p "$out"
strip_map "marked-$MARKED/package/lib/marked.umd.js" "$out/marked.min.js"
strip_map "highlightjs-cdn-assets-$HIGHLIGHT/package/highlight.min.js" "$out/highlight.min.js"
strip_map "highlightjs-cdn-assets-$HIGHLIGHT/package/styles/github.min.css" "$out/hljs-light.min.css"
strip_map "highlightjs-cdn-assets-$HIGHLIGHT/package/styles/github-dark.min.css" "$out/hljs-dark.min.css"
strip_map "dompurify-$DOMPURIFY/package/dist/purify.min.js" "$out/purify.min.js"
cp "marked-$MARKED/package/LICENSE" "$out/LICENSE.marked"
cp "highlightjs-cdn-assets-$HIGHLIGHT/package/LICENSE" "$out/LICENSE.highlight.js"
cp "dompurify-$DOMPURIFY/package/LICENSE" "$out/LICENSE.dompurify"
cat >"$out/VERSIONS" <<END
marked $MARKED
@highlightjs/cdn-assets $HIGHLIGHT
dompurify $DOMPURIFY
END
echo "webui/vendor: marked $MARKED, highlight.js $HIGHLIGHT, DOMPurify $DOMPURIFY"
