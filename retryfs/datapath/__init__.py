"""The data path the pyarrow face uses: streams that resume and replay, ``copy_files`` onto
(`upload`) and from (`download`) a wrapper, small local files, commits recorded and verified.
"""
