from tracetool.cli import main

main()
