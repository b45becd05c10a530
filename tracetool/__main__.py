from tracetool.cli import main

if __name__ == "__main__":  # not when a child process of a report imports it
    main()
