// The values of the small XML documents AWS answers with (S3 listings, STS
// credentials, error bodies): the text between <Tag> and </Tag>, entities
// decoded. Not a general XML parser: tags are matched as written, without
// attributes or namespaces, as these answers write them.
#pragma once

#include <string>
#include <vector>

namespace torch_shards::io::storage {

// `text` with XML's entities (&amp; &lt; &gt; &quot; &apos; &#N; &#xN;) replaced by what they stand for.
std::string decode_xml(const std::string& text);

// The text of every <tag>...</tag> inside `xml`, in order, decoded.
std::vector<std::string> xml_values(const std::string& xml, const std::string& tag);

}  // namespace torch_shards::io::storage
