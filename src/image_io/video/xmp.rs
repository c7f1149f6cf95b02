//! Upstream's WebP XMP packet (`build_webp_xmp_packet` in examples/common/media_io.cpp): the
//! parameters text in an `sdcpp:parameters` element.

/// The XMP packet holding `text`.
pub(super) fn packet(text: &str) -> String {
    format!(
        "<?xpacket begin=\"\" id=\"W5M0MpCehiHzreSzNTczkc9d\"?>\n\
         <x:xmpmeta xmlns:x=\"adobe:ns:meta/\">\n  \
         <rdf:RDF xmlns:rdf=\"http://www.w3.org/1999/02/22-rdf-syntax-ns#\">\n    \
         <rdf:Description xmlns:sdcpp=\"https://github.com/leejet/stable-diffusion.cpp/ns/1.0/\">\n      \
         <sdcpp:parameters>{}</sdcpp:parameters>\n    \
         </rdf:Description>\n  </rdf:RDF>\n</x:xmpmeta>\n<?xpacket end=\"w\"?>",
        crate::image_io::encode::xml_escape(text)
    )
}

#[cfg(test)]
mod tests {
    #[test]
    fn text_is_escaped() {
        let p = super::packet("a<b & \"c\"");
        assert!(p.contains("<sdcpp:parameters>a&lt;b &amp; &quot;c&quot;</sdcpp:parameters>"));
    }
}
