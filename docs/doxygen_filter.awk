# Doxygen INPUT_FILTER for include/torch_shards/*.h: the headers document their API in
# plain // comments; this turns them into Doxygen comments as Doxygen reads the file
# (the file on disk is not changed).
#   - the comment block at the top of a header: the file's description (\file); the
#     umbrella header's is also the reference's main page;
#   - a // line before a declaration: /// (documents the declaration below);
#   - a trailing "  // ..." after code: ///< (documents the member on that line);
#   - comment lines indented by two spaces or more (examples): a code block;
#   - "// @{" ... "// @}": a member group, documented by the comment before "// @{";
#   - "}  // namespace ..." and comments inside function bodies are left alone.
function code_block(text) {
  # "//   x" -> "///     x": four more spaces than the paragraph, a Markdown code block.
  return "    " text
}
# Prints a comment line, with an empty comment line where a code block starts or ends.
function emit(indent, text,    is_code) {
  is_code = (text ~ /^     /)
  # Outside code blocks "<rank>", "<i>" are placeholders, not HTML tags.
  if (!is_code) { gsub(/</, "\\<", text); gsub(/>/, "\\>", text) }
  if (is_code != in_code && text != "" && previous != "") print indent "///"
  in_code = is_code
  previous = text
  print indent "///" text
}
# The main page: the umbrella header's comment, and where each part of the API is.
function main_page(    i) {
  print ""
  print "/// \\mainpage torch_shards C++ API"
  in_code = 0; previous = ""
  for (i = 1; i <= top_lines; i++) emit("", top[i])
  emit("", "")
  emit("", " The headers (see Files): source.h (sources, storage options), open.h (open a path by what")
  emit("", " it holds), strategy.h (strategies),")
  emit("", " dataset.h (ShardedDataset, its options and checkpoints), sampler.h (DistributedSampler),")
  emit("", " handle.h (the value handles), version.h (version and build information).")
  print ""
}
BEGIN { header = 1; depth = 0; in_code = 0; previous = ""; top_lines = 0 }
{
  line = $0
  if (header) {
    if (line ~ /^\/\//) {
      text = substr(line, 3)
      if (NR == 1) { print "/// \\file"; }
      if (text ~ /^   /) text = code_block(text)
      emit("", text)
      top[++top_lines] = text
      next
    }
    header = 0
    if (FILENAME ~ /(^|\/)torch_shards\.h$/) main_page()
  }
  # "// @{" and "// @}" (a member group: the comment before "// @{" documents each member in it).
  if (line ~ /^[ \t]*\/\/ @[{}][ \t]*$/) {
    sub(/\/\/ @/, "///@", line)
    in_code = 0; previous = ""
    print line
    next
  }
  if (line ~ /^[ \t]*\/\/([ ]|$)/ && line !~ /\/\/ namespace /) {
    if (depth == 0) {
      match(line, /\/\//)
      indent = substr(line, 1, RSTART - 1)
      text = substr(line, RSTART + 2)
      if (text ~ /^   /) text = code_block(text)
      emit(indent, text)
      next
    }
  } else if (match(line, /[;,{}]  +\/\/ /) && line !~ /\/\/ namespace / && depth == 0 &&
             line !~ /^[ \t]*(class|struct|enum class) [A-Za-z_]+;/) {
    # (a forward declaration's comment says where the type lives: not its documentation)
    line = substr(line, 1, RSTART) " ///< " substr(line, RSTART + RLENGTH)
  }
  in_code = 0; previous = ""
  print line
  # Function bodies: braces after a ')' (or a body opened at line start) nest; class and
  # namespace braces do not count.
  body = line
  sub(/\/\/.*/, "", body)
  if (depth > 0 || body ~ /\)[^;{]*\{[^}]*$/ || body ~ /\) (const )?(override )?\{/) {
    opens = gsub(/\{/, "{", body); closes = gsub(/\}/, "}", body)
    if (depth > 0 || opens > closes) depth += opens - closes
    if (depth < 0) depth = 0
  }
}
